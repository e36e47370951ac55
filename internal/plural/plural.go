// Package plural writes counts with their noun in the right number: "1
// evaluation", "2 evaluations", "0 batches", so that human output never
// shows "1 evaluations" or "run(s)".
package plural

import (
	"fmt"
	"strings"
)

// irregular holds the nouns of trainmeter's output whose plural is not
// noun+"s" ("epoch" is regular, so -ch is not a rule).
var irregular = map[string]string{
	"batch": "batches",
	"entry": "entries",
}

// Noun is noun in the number n asks for.
func Noun(n int64, noun string) string {
	if n == 1 || n == -1 {
		return noun
	}
	if p, ok := irregular[noun]; ok {
		return p
	}
	if strings.HasSuffix(noun, "s") || strings.HasSuffix(noun, "x") {
		return noun + "es"
	}
	return noun + "s"
}

// N is "n noun" with noun in the right number, e.g. N(1, "evaluation") =
// "1 evaluation", N(3, "batch") = "3 batches".
func N[I ~int | ~int32 | ~int64 | ~uint | ~uint32 | ~uint64](n I, noun string) string {
	return fmt.Sprintf("%d %s", n, Noun(int64(n), noun))
}
