package admin

// SetBeforeDeleteGroupHook makes insp.DeleteGroupOffsets call hook after it
// checked the group's owners and before it deletes (tests only).
func SetBeforeDeleteGroupHook(insp *Inspector, hook func()) {
	insp.beforeDeleteGroup = hook
}
