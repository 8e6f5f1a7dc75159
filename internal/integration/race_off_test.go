//go:build !race

package integration

// raceEnabled: built with -race, whose shadow memory inflates RSS.
const raceEnabled = false
