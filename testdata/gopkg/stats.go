package gopkg

type Histogram struct {
	Buckets []int
	Width   float64
}

func NewHistogram(buckets int, width float64) *Histogram {
	return &Histogram{Buckets: make([]int, buckets), Width: width}
}

func (h *Histogram) Add(x float64) {
	i := int(x / h.Width)
	if i < 0 {
		i = 0
	}
	if i >= len(h.Buckets) {
		i = len(h.Buckets) - 1
	}
	h.Buckets[i]++
}

// Mean returns the arithmetic mean of xs, or 0 for none.
func Mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}
