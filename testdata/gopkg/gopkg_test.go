package gopkg

import (
	"reflect"
	"testing"
)

func TestTopWords(t *testing.T) {
	got := Top(Count(Words("The cat and the hat. The cat's hat!")), 3)
	want := []string{"the", "hat", "and"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Top = %q, want %q", got, want)
	}
}

func TestHistogram(t *testing.T) {
	h := NewHistogram(3, 10)
	for _, x := range []float64{-1, 5, 15, 25, 99} {
		h.Add(x)
	}
	if want := []int{2, 1, 2}; !reflect.DeepEqual(h.Buckets, want) {
		t.Fatalf("Buckets = %v, want %v", h.Buckets, want)
	}
	if m := Mean([]float64{1, 2, 3}); m != 2 {
		t.Fatalf("Mean = %v, want 2", m)
	}
}
