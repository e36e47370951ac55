//go:build race

package fakenvml_test

// raceEnabled: the study is pure arithmetic, many times slower under -race.
const raceEnabled = true
