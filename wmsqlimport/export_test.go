package wmsqlimport

// SetBeforeLockHook makes Run call hook before it takes a topic's lock,
// until the returned function removes it (tests only; not while an
// import runs).
func SetBeforeLockHook(hook func(topic string)) (restore func()) {
	importBeforeLock = hook
	return func() { importBeforeLock = nil }
}
