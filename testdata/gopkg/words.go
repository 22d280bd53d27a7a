// Package gopkg is a small word-statistics package: the code that
// examples/agent works on. Some exported declarations lack doc comments;
// the example agent adds them, then runs go vet and go test.
package gopkg

import (
	"sort"
	"strings"
	"unicode"
)

func Words(s string) []string {
	return strings.FieldsFunc(strings.ToLower(s), func(r rune) bool {
		return !unicode.IsLetter(r) && r != '\''
	})
}

func Count(words []string) map[string]int {
	counts := make(map[string]int, len(words))
	for _, w := range words {
		counts[w]++
	}
	return counts
}

// Top returns the n most frequent words, the most frequent first; words
// with equal counts are in alphabetical order.
func Top(counts map[string]int, n int) []string {
	words := make([]string, 0, len(counts))
	for w := range counts {
		words = append(words, w)
	}
	sort.Slice(words, func(i, j int) bool {
		if counts[words[i]] != counts[words[j]] {
			return counts[words[i]] > counts[words[j]]
		}
		return words[i] < words[j]
	})
	if len(words) > n {
		words = words[:n]
	}
	return words
}
