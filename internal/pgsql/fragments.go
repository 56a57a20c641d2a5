package pgsql

// Fragments for the statements that still sit beside their callers in the
// root package (the message browser and replay, inspect_messages_sql.go):
// the same text the statements here use.

// ClassesOf is the condition, on messages m, that leaves out the rows of
// retention classes the topic (an SQL expression) no longer keeps.
func (t *Tables) ClassesOf(topic string) string { return t.classesOf(topic) }

// QuoteLiteral quotes s as an SQL string literal, for constants built into
// a statement's text (never for values from users: those are parameters).
func QuoteLiteral(s string) string { return quoteLiteral(s) }
