//go:build race

package pglease_test

// raceDetector reports whether the tests run with -race.
const raceDetector = true
