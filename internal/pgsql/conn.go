package pgsql

import "context"

// The statements of this file run on connections a Subscriber dials
// itself, outside the pool: they tell which server a connection reached.

// SystemIdentifier returns the system identifier of the cluster conn
// reached. Roles without the privilege to read pg_control_system() get
// an error.
func SystemIdentifier(ctx context.Context, conn Querier) (string, error) {
	var id string
	err := conn.QueryRow(ctx, "SELECT system_identifier::text FROM pg_catalog.pg_control_system()").Scan(&id)
	return id, err
}

// BackendPID returns the process id of the backend conn's statements run
// on.
func BackendPID(ctx context.Context, conn Querier) (int32, error) {
	var pid int32
	err := conn.QueryRow(ctx, "SELECT pg_catalog.pg_backend_pid()").Scan(&pid)
	return pid, err
}

// ListeningOn returns the process id of the backend conn's statements run
// on, and whether that backend LISTENs on channel (unquoted), read by one
// statement.
func ListeningOn(ctx context.Context, conn Querier, channel string) (pid int32, listening bool, err error) {
	err = conn.QueryRow(ctx, "SELECT pg_catalog.pg_backend_pid(), $1::text = ANY (ARRAY(SELECT pg_catalog.pg_listening_channels()::text))",
		channel).Scan(&pid, &listening)
	return pid, listening, err
}
