//go:build race

package cli

// raceEnabled: listing 100,000 runs is many times slower under -race.
const raceEnabled = true
