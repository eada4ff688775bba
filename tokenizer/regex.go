package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"regexp"
	"regexp/syntax"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
	syntax2 "github.com/dlclark/regexp2/syntax"
)

// regex is a Split or Replace pattern of a tokenizer.json, which is
// untrusted input: matching it must end in time bounded by the text.
//
// HF compiles patterns with Oniguruma, a backtracking engine. A pattern
// that needs no backtracking feature (no lookaround, backreference or
// atomic group), holds no assertion and cannot match the empty string runs
// on Go's regexp, whose time for one match is linear in the text and whose
// leftmost-first matches are the ones a backtracking engine finds. Any
// other pattern runs on regexp2, which has Oniguruma's lookahead. Either
// way, one match and all the matches of a text together are bounded by a
// time that grows with the text (matchBudget): a pattern whose
// backtracking explodes, or that rescans the text for every match, fails
// the encoding with an error instead of hanging it.
type regex struct {
	pattern string
	linear  *regexp.Regexp  // nil unless the pattern runs in linear time
	bt      *regexp2.Regexp // the backtracking matcher otherwise, for short texts
	literal string          // a String pattern when both are nil
	// long holds the backtracking matcher compiled again for longer texts,
	// with a bound that grows with them: one per power of two of the
	// text's length in bytes.
	long sync.Map // int -> *regexp2.Regexp
}

// The bound of one match of a backtracking pattern: matchTimeout, plus
// matchTimePerByte for every byte of the text. Real pre-tokenizer patterns
// match a word in microseconds and a run of white space in tens of
// nanoseconds a byte; a match that takes this long backtracks exponentially
// and would not finish.
var (
	matchTimeout     = 2 * time.Second
	matchTimePerByte = time.Microsecond
)

// shortText is the longest text the regex's first matcher takes (its
// bound then holds matchTimeout and the per-byte part of this length).
const shortText = 64 << 10

// matcherFor is the backtracking matcher for a text of n bytes, its
// MatchTimeout at least matchTimeout + n × matchTimePerByte.
func (r *regex) matcherFor(n int) (*regexp2.Regexp, error) {
	if n <= shortText {
		return r.bt, nil
	}
	class := bits.Len(uint(n)) // n < 1<<class
	if re, ok := r.long.Load(class); ok {
		return re.(*regexp2.Regexp), nil
	}
	re, err := compileBacktracking(r.pattern, matchBudget(1<<class))
	if err != nil {
		return nil, err
	}
	got, _ := r.long.LoadOrStore(class, re)
	return got.(*regexp2.Regexp), nil
}

// compileBacktracking compiles pattern for regexp2, every match bounded by
// limit.
func compileBacktracking(pattern string, limit time.Duration) (*regexp2.Regexp, error) {
	// Oniguruma's ^ and $ match at line boundaries, as regexp2's do with
	// Multiline.
	re, err := regexp2.Compile(foldLongS(pattern), regexp2.Multiline)
	if err != nil {
		return nil, err
	}
	re.MatchTimeout = limit
	return re, nil
}

// MatchTimeoutError is the error of an encoding stopped because a pattern of
// the tokenizer took longer than its bound (matchBudget) to match a text.
type MatchTimeoutError struct {
	Pattern string
	Limit   time.Duration
	Text    int // bytes of the text being matched
}

func (e *MatchTimeoutError) Error() string {
	return fmt.Sprintf("regex %s: matching a %d-byte text took longer than %v "+
		"(a pattern that backtracks or rescans without bound?)", quoteShort(e.Pattern), e.Text, e.Limit.Round(time.Millisecond))
}

// PatternError is a pattern of the tokenizer that does not compile.
type PatternError struct {
	Pattern string
	Err     error
}

// Error says what is wrong, quoting no more than the start of a long
// pattern (the compiler's own message repeats it whole).
func (e *PatternError) Error() string {
	msg := e.Err.Error()
	if se := (*syntax2.Error)(nil); errors.As(e.Err, &se) {
		msg = "error parsing regexp: " + se.Code.String()
		if len(se.Args) > 0 {
			msg = "error parsing regexp: " + fmt.Sprintf(se.Code.String(), se.Args...)
		}
	}
	return fmt.Sprintf("regex %s: %s", quoteShort(e.Pattern), msg)
}

func (e *PatternError) Unwrap() error { return e.Err }

// quoteShort quotes s, or its first bytes and its length when it is long:
// a pattern from a hostile file may be megabytes.
func quoteShort(s string) string {
	const keep = 200
	if len(s) <= keep {
		return strconv.Quote(s)
	}
	head := s[:keep]
	for !utf8.ValidString(head) && len(head) > 0 {
		head = head[:len(head)-1]
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(head), len(s))
}

// matchFailure carries a MatchTimeoutError from findAll, deep in the
// normalizers and pre-tokenizers, to the call that encodes, which returns
// it (catchMatchFailure).
type matchFailure struct{ err *MatchTimeoutError }

// catchMatchFailure turns a matchFailure panic into *err, after prefix;
// any other panic goes on.
func catchMatchFailure(err *error, prefix string) {
	if r := recover(); r != nil {
		f, ok := r.(matchFailure)
		if !ok {
			panic(r)
		}
		*err = fmt.Errorf("%s%w", prefix, f.err)
	}
}

// parsePattern reads {"Regex": "..."} or {"String": "..."}.
func parsePattern(raw json.RawMessage) (*regex, error) {
	var p struct {
		Regex  *string `json:"Regex"`
		String *string `json:"String"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, fmt.Errorf("pattern: want {\"Regex\": ...} or {\"String\": ...}, got %s", short(raw))
	}
	switch {
	case p.Regex != nil:
		return compileRegex(*p.Regex)
	case p.String != nil && *p.String != "":
		return &regex{pattern: *p.String, literal: *p.String}, nil
	case p.String != nil:
		return compileRegex("")
	}
	return nil, errors.New("pattern: want {\"Regex\": ...} or {\"String\": ...}")
}

func compileRegex(pattern string) (*regex, error) {
	if re := compileLinear(pattern); re != nil {
		return &regex{pattern: pattern, linear: re}, nil
	}
	re, err := compileBacktracking(pattern, matchBudget(shortText))
	if err != nil {
		return nil, &PatternError{Pattern: pattern, Err: err}
	}
	return &regex{pattern: pattern, bt: re}, nil
}

// findAll is the byte ranges of the successive non-overlapping matches in s
// (valid UTF-8). A backtracking match that exceeds matchTimeout panics with
// a matchFailure, which the encoding call recovers.
func (r *regex) findAll(s string) [][2]int {
	var out [][2]int
	if r.linear == nil && r.bt == nil {
		for i := 0; ; {
			j := strings.Index(s[i:], r.literal)
			if j < 0 {
				return out
			}
			out = append(out, [2]int{i + j, i + j + len(r.literal)})
			i += j + len(r.literal)
		}
	}
	// Each match is bounded, and so is their sum: a pattern such as a+b|a
	// rescans the rest of a run of a's for every match, quadratic time.
	start := time.Now()
	budget := matchBudget(len(s))
	over := func() {
		if time.Since(start) > budget {
			panic(matchFailure{&MatchTimeoutError{Pattern: r.pattern, Limit: budget, Text: len(s)}})
		}
	}
	if r.linear != nil {
		// The pattern has no assertion and no empty match: a match found
		// in the rest of the text is the one FindAll would find there.
		for pos := 0; pos < len(s); {
			m := r.linear.FindStringIndex(s[pos:])
			if m == nil {
				break
			}
			out = append(out, [2]int{pos + m[0], pos + m[1]})
			pos += m[1]
			over()
		}
		return out
	}
	runes := []rune(s)
	ri, bi := 0, 0 // a rune index and its byte offset
	offset := func(k int) int {
		for ; ri < k; ri++ {
			bi += utf8.RuneLen(runes[ri])
		}
		return bi
	}
	re, err := r.matcherFor(len(s))
	if err != nil { // compiled once already: cannot fail
		re = r.bt
	}
	m, err := re.FindRunesMatch(runes)
	for m != nil && err == nil {
		start := offset(m.Index)
		end := offset(m.Index + m.Length)
		out = append(out, [2]int{start, end})
		over()
		m, err = re.FindNextMatch(m)
	}
	if err != nil {
		panic(matchFailure{&MatchTimeoutError{Pattern: r.pattern, Limit: re.MatchTimeout, Text: len(s)}})
	}
	return out
}

// matchBudget is the time matching a text of n bytes may take, one match
// or all: matchTimeout + matchTimePerByte for every byte (at least
// shortText's).
func matchBudget(n int) time.Duration {
	return matchTimeout + time.Duration(max(n, shortText))*matchTimePerByte
}

// compileLinear compiles pattern for Go's regexp when that gives exactly
// the matches regexp2 gives, else returns nil. The pattern must use only
// syntax both read alike, with \s, \d and \w rewritten as the Unicode
// classes regexp2 gives them (Go's are ASCII); it must not match the empty
// string, where the two differ in which empty matches they report after a
// match, and must hold no assertion (^, $), so that the next match can be
// searched for in the rest of the text alone.
func compileLinear(pattern string) *regexp.Regexp {
	translated, ok := toGoSyntax(pattern)
	if !ok {
		return nil
	}
	translated = "(?m)" + translated // Oniguruma's ^ and $ match at lines
	parsed, err := syntax.Parse(translated, syntax.Perl)
	if err != nil || nullable(parsed) || hasAssertion(parsed) {
		return nil
	}
	re, err := regexp.Compile(translated)
	if err != nil {
		return nil
	}
	return re
}

// Unicode classes as regexp2 has them, written for the inside of a Go
// character class.
var (
	spaceClass = rangesOf(unicode.White_Space) // \s: unicode.IsSpace
	digitClass = `\p{Nd}`                      // \d
	wordClass  = `\p{L}\p{Mn}\p{Nd}\p{Pc}\x{200C}\x{200D}`
)

// rangesOf writes a range table as character class ranges.
func rangesOf(t *unicode.RangeTable) string {
	var b strings.Builder
	add := func(lo, hi, stride uint32) {
		for c := lo; c <= hi; c += stride {
			if stride == 1 {
				fmt.Fprintf(&b, `\x{%x}-\x{%x}`, lo, hi)
				return
			}
			fmt.Fprintf(&b, `\x{%x}`, c)
		}
	}
	for _, r := range t.R16 {
		add(uint32(r.Lo), uint32(r.Hi), uint32(r.Stride))
	}
	for _, r := range t.R32 {
		add(r.Lo, r.Hi, r.Stride)
	}
	return b.String()
}

// toGoSyntax rewrites a pattern in the syntax Go's regexp reads the same
// way regexp2 does, or reports false when the pattern uses anything outside
// that common part (lookaround, backreferences, \b, class subtraction,
// POSIX classes, flags other than m and s, ...).
func toGoSyntax(pattern string) (string, bool) {
	var b strings.Builder
	inClass := false
	classStart := 0 // index of the first rune of the class's content
	rs := []rune(pattern)
	for i := 0; i < len(rs); i++ {
		c := rs[i]
		switch {
		case c == '\\':
			if i+1 == len(rs) {
				return "", false
			}
			i++
			e := rs[i]
			switch {
			case e == 's' || e == 'd' || e == 'w':
				cls := map[rune]string{'s': spaceClass, 'd': digitClass, 'w': wordClass}[e]
				if inClass {
					b.WriteString(cls)
				} else {
					b.WriteString("[" + cls + "]")
				}
			case e == 'S' || e == 'D' || e == 'W':
				if inClass { // a complement inside a class: not written here
					return "", false
				}
				cls := map[rune]string{'S': spaceClass, 'D': digitClass, 'W': wordClass}[e]
				b.WriteString("[^" + cls + "]")
			case e == 'p' || e == 'P':
				j := i + 1
				if j < len(rs) && rs[j] == '{' {
					for j < len(rs) && rs[j] != '}' {
						j++
					}
				}
				if j >= len(rs) {
					return "", false
				}
				b.WriteString(string(rs[i-1 : j+1]))
				i = j
			case strings.ContainsRune("tnrfv", e):
				b.WriteString(string(rs[i-1 : i+1]))
			case e < utf8.RuneSelf && !isAlnum(e):
				b.WriteString(string(rs[i-1 : i+1])) // an escaped symbol
			default: // \b, \A, \Z, \G, \k, \Q, \u, \x, \0, \1...: not common ground
				return "", false
			}
		case inClass:
			switch {
			case c == ']' && i > classStart:
				inClass = false
			case c == '[' && i+1 < len(rs) && rs[i+1] == ':': // POSIX class in Go, literal in regexp2
				return "", false
			case c == '-' && i+1 < len(rs) && rs[i+1] == '[': // class subtraction in regexp2
				return "", false
			}
			b.WriteRune(c)
		case c == '[':
			inClass = true
			classStart = i + 1
			if classStart < len(rs) && rs[classStart] == '^' {
				classStart++
			}
			b.WriteRune(c)
		case c == '(' && i+1 < len(rs) && rs[i+1] == '?':
			// Only (?:...) and the flags m and s, as (?flags) or
			// (?flags:...): names, lookaround and case folding (regexp2
			// lowercases, Go folds) are not common ground.
			j := i + 2
			for j < len(rs) && strings.ContainsRune("ms-", rs[j]) {
				j++
			}
			if j == len(rs) || (rs[j] != ':' && rs[j] != ')') || (rs[j] == ')' && j == i+2) {
				return "", false
			}
			b.WriteString(string(rs[i : j+1]))
			i = j
		case c == '{' && i+1 < len(rs) && rs[i+1] == ',': // {,n}: a bound in Oniguruma, a literal in Go
			return "", false
		default:
			b.WriteRune(c)
		}
	}
	if inClass {
		return "", false
	}
	return b.String(), true
}

func isAlnum(r rune) bool {
	return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9'
}

// hasAssertion reports whether re holds an empty-width assertion (^, $),
// which depends on the text before a match.
func hasAssertion(re *syntax.Regexp) bool {
	switch re.Op {
	case syntax.OpBeginLine, syntax.OpEndLine, syntax.OpBeginText, syntax.OpEndText,
		syntax.OpWordBoundary, syntax.OpNoWordBoundary:
		return true
	}
	for _, sub := range re.Sub {
		if hasAssertion(sub) {
			return true
		}
	}
	return false
}

// nullable reports whether re can match the empty string somewhere,
// taking every empty-width assertion as one that can hold.
func nullable(re *syntax.Regexp) bool {
	switch re.Op {
	case syntax.OpLiteral:
		return len(re.Rune) == 0
	case syntax.OpCharClass, syntax.OpAnyChar, syntax.OpAnyCharNotNL, syntax.OpNoMatch:
		return false
	case syntax.OpStar, syntax.OpQuest:
		return true
	case syntax.OpPlus, syntax.OpCapture:
		return nullable(re.Sub[0])
	case syntax.OpRepeat:
		return re.Min == 0 || nullable(re.Sub[0])
	case syntax.OpConcat:
		for _, s := range re.Sub {
			if !nullable(s) {
				return false
			}
		}
		return true
	case syntax.OpAlternate:
		for _, s := range re.Sub {
			if nullable(s) {
				return true
			}
		}
		return false
	}
	return true // empty matches and assertions
}
