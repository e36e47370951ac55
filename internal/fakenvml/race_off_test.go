//go:build !race

package fakenvml_test

const raceEnabled = false
