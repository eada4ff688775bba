package model

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
)

// sampler draws tokens from logits on the host as HF's sampling does:
// TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, then a draw
// from the softmax of what is left.
type sampler struct {
	temperature float64
	topK        int
	topP        float64
	rng         *rand.Rand
	cands       []candidate
}

type candidate struct {
	id int
	x  float64 // logit / temperature, then the unnormalised probability
}

// rowStream separates the random streams of the rows of one seed.
const rowStream = 0x9e3779b97f4a7c15

// newSampler returns the sampler of row b.
func newSampler(s Sampling, b int) *sampler {
	return &sampler{
		temperature: s.Temperature,
		topK:        s.TopK,
		topP:        s.TopP,
		rng:         rand.New(rand.NewPCG(s.Seed, rowStream^uint64(b))),
	}
}

// sample draws one token id from logits (-inf entries are never drawn). It
// returns -1 when there is nothing sound to draw from: a NaN or +inf logit,
// or no logit above -inf.
func (s *sampler) sample(logits []float32) int {
	c := s.cands[:0]
	for id, l := range logits {
		switch x := float64(l); {
		case math.IsNaN(x) || math.IsInf(x, 1):
			return -1
		case !math.IsInf(x, -1):
			c = append(c, candidate{id, x / s.temperature})
		}
	}
	s.cands = c
	if len(c) == 0 {
		return -1
	}

	// top-k keeps every token whose score reaches the k-th largest (ties at
	// the boundary included, as scores < topk(...)[-1] is what HF removes).
	if s.topK > 0 && s.topK < len(c) {
		kth := kthLargest(c, s.topK)
		c = slices.DeleteFunc(c, func(x candidate) bool { return x.x < kth })
	}

	// softmax, unnormalised.
	hi := math.Inf(-1)
	for _, x := range c {
		hi = max(hi, x.x)
	}
	var sum float64
	for i := range c {
		c[i].x = math.Exp(c[i].x - hi)
		sum += c[i].x
	}

	// top-p: sorted ascending, HF removes the tokens whose cumulative
	// probability is ≤ 1 - top_p, keeping the most likely one. A token of
	// probability below (1 - top_p)/n is always removed (the tokens up to it
	// sum to less than that), so those are dropped before sorting, their
	// mass counted.
	if s.topP > 0 && s.topP < 1 {
		cut := 1 - s.topP
		small := cut / float64(len(c)) * sum
		var dropped float64
		c = slices.DeleteFunc(c, func(x candidate) bool {
			if x.x < small {
				dropped += x.x
				return true
			}
			return false
		})
		slices.SortFunc(c, func(a, b candidate) int { return cmp.Or(cmp.Compare(a.x, b.x), cmp.Compare(b.id, a.id)) })
		cum, first := dropped/sum, 0
		for i, x := range c[:len(c)-1] {
			cum += x.x / sum
			if cum > cut {
				break
			}
			first = i + 1
		}
		c = c[first:]
	}

	var total float64
	for _, x := range c {
		total += x.x
	}
	u := s.rng.Float64() * total
	for _, x := range c {
		u -= x.x
		if u < 0 {
			return x.id
		}
	}
	return c[len(c)-1].id
}

// kthLargest is the k-th largest score of c (1-based), found without
// sorting c.
func kthLargest(c []candidate, k int) float64 {
	v := make([]float64, len(c))
	for i, x := range c {
		v[i] = x.x
	}
	// quickselect for index k-1 of the descending order.
	lo, hi, want := 0, len(v)-1, k-1
	for lo < hi {
		pivot := v[(lo+hi)/2]
		i, j := lo, hi
		for i <= j {
			for v[i] > pivot {
				i++
			}
			for v[j] < pivot {
				j--
			}
			if i <= j {
				v[i], v[j] = v[j], v[i]
				i++
				j--
			}
		}
		switch {
		case want <= j:
			hi = j
		case want >= i:
			lo = i
		default:
			return v[want]
		}
	}
	return v[want]
}

// argmax is the first index of the largest value, a NaN counting as the
// largest, as torch.argmax (and the naive set's kernel): a row holding a NaN
// then chooses it, and choose's finite check sees it.
func argmax(v []float32) int {
	best := 0
	for i, x := range v {
		if math.IsNaN(float64(v[best])) {
			break
		}
		if x > v[best] || math.IsNaN(float64(x)) {
			best = i
		}
	}
	return best
}
