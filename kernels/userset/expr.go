package userset

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// expr is a parsed integer expression over an op's sizes, the manifest's
// grid and shared memory: integers, the sizes by name, + - * / % with C's
// precedence, parentheses, and cdiv(a, b) (a/b rounded up), min(a, b, ...)
// and max(a, b, ...). Nothing else: a manifest is data, not code.
type expr interface {
	eval(env map[string]int64) (int64, error)
}

type num int64
type ident string
type binop struct {
	op   byte
	l, r expr
}
type call struct {
	fn   string
	args []expr
}

func (n num) eval(map[string]int64) (int64, error) { return int64(n), nil }

func (v ident) eval(env map[string]int64) (int64, error) {
	x, ok := env[string(v)]
	if !ok {
		return 0, fmt.Errorf("no size %q", string(v))
	}
	return x, nil
}

func (b binop) eval(env map[string]int64) (int64, error) {
	l, err := b.l.eval(env)
	if err != nil {
		return 0, err
	}
	r, err := b.r.eval(env)
	if err != nil {
		return 0, err
	}
	switch b.op {
	case '+':
		return l + r, nil
	case '-':
		return l - r, nil
	case '*':
		return l * r, nil
	}
	if r == 0 {
		return 0, fmt.Errorf("division by zero")
	}
	if b.op == '/' {
		return l / r, nil
	}
	return l % r, nil
}

func (c call) eval(env map[string]int64) (int64, error) {
	v := make([]int64, len(c.args))
	for i, a := range c.args {
		x, err := a.eval(env)
		if err != nil {
			return 0, err
		}
		v[i] = x
	}
	switch c.fn {
	case "cdiv":
		if v[1] <= 0 {
			return 0, fmt.Errorf("cdiv by %d", v[1])
		}
		return (v[0] + v[1] - 1) / v[1], nil
	case "min":
		return slices.Min(v), nil
	}
	return slices.Max(v), nil
}

// parseExprs parses up to max comma-separated expressions whose names are
// all in vars.
func parseExprs(src string, max int, vars []string) ([]expr, error) {
	p := &parser{src: src, vars: vars}
	var out []expr
	for {
		e, err := p.sum()
		if err != nil {
			return nil, err
		}
		out = append(out, e)
		p.space()
		if p.pos == len(p.src) {
			break
		}
		if p.src[p.pos] != ',' {
			return nil, p.errorf("unexpected %q", p.src[p.pos:p.pos+1])
		}
		p.pos++
	}
	if len(out) > max {
		return nil, fmt.Errorf("%q: %d expressions, at most %d", src, len(out), max)
	}
	return out, nil
}

type parser struct {
	src  string
	pos  int
	vars []string
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("%q at column %d: %s", p.src, p.pos+1, fmt.Sprintf(format, args...))
}

func (p *parser) space() {
	for p.pos < len(p.src) && (p.src[p.pos] == ' ' || p.src[p.pos] == '\t') {
		p.pos++
	}
}

// peek is the next non-space byte, 0 at the end.
func (p *parser) peek() byte {
	p.space()
	if p.pos == len(p.src) {
		return 0
	}
	return p.src[p.pos]
}

func (p *parser) sum() (expr, error) {
	l, err := p.product()
	for err == nil {
		c := p.peek()
		if c != '+' && c != '-' {
			return l, nil
		}
		p.pos++
		var r expr
		if r, err = p.product(); err == nil {
			l = binop{c, l, r}
		}
	}
	return nil, err
}

func (p *parser) product() (expr, error) {
	l, err := p.unary()
	for err == nil {
		c := p.peek()
		if c != '*' && c != '/' && c != '%' {
			return l, nil
		}
		p.pos++
		var r expr
		if r, err = p.unary(); err == nil {
			l = binop{c, l, r}
		}
	}
	return nil, err
}

func (p *parser) unary() (expr, error) {
	if p.peek() == '-' {
		p.pos++
		e, err := p.unary()
		if err != nil {
			return nil, err
		}
		return binop{'-', num(0), e}, nil
	}
	return p.primary()
}

func (p *parser) primary() (expr, error) {
	c := p.peek()
	switch {
	case c == '(':
		p.pos++
		e, err := p.sum()
		if err != nil {
			return nil, err
		}
		if p.peek() != ')' {
			return nil, p.errorf("want )")
		}
		p.pos++
		return e, nil
	case c >= '0' && c <= '9':
		start := p.pos
		for p.pos < len(p.src) && p.src[p.pos] >= '0' && p.src[p.pos] <= '9' {
			p.pos++
		}
		n, err := strconv.ParseInt(p.src[start:p.pos], 10, 32)
		if err != nil {
			return nil, p.errorf("number %s out of range", p.src[start:p.pos])
		}
		return num(n), nil
	case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
		start := p.pos
		for p.pos < len(p.src) && (p.src[p.pos] == '_' || p.src[p.pos] >= 'a' && p.src[p.pos] <= 'z' ||
			p.src[p.pos] >= 'A' && p.src[p.pos] <= 'Z' || p.src[p.pos] >= '0' && p.src[p.pos] <= '9') {
			p.pos++
		}
		name := p.src[start:p.pos]
		if p.peek() != '(' {
			if !slices.Contains(p.vars, name) {
				p.pos = start
				return nil, p.errorf("unknown size %q (this op's: %s)", name, strings.Join(p.vars, ", "))
			}
			return ident(name), nil
		}
		return p.call(name, start)
	case c == 0:
		return nil, p.errorf("expression ends early")
	}
	return nil, p.errorf("unexpected %q", string(c))
}

func (p *parser) call(name string, start int) (expr, error) {
	if name != "cdiv" && name != "min" && name != "max" {
		p.pos = start
		return nil, p.errorf("unknown function %q (cdiv, min, max)", name)
	}
	p.pos++ // (
	var args []expr
	for {
		e, err := p.sum()
		if err != nil {
			return nil, err
		}
		args = append(args, e)
		switch p.peek() {
		case ',':
			p.pos++
			continue
		case ')':
			p.pos++
		default:
			return nil, p.errorf("want , or ) in %s(...)", name)
		}
		break
	}
	if name == "cdiv" && len(args) != 2 {
		return nil, p.errorf("cdiv takes 2 arguments, got %d", len(args))
	}
	return call{name, args}, nil
}
