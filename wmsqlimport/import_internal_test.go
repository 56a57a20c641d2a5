package wmsqlimport

import (
	"testing"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// The import's own tables are named in the API (RunsTable,
// GroupsTable) and in the statements of internal/pgsql.
func TestImportTableNamesMatchStatements(t *testing.T) {
	if RunsTable != pgsql.ImportRunsTable || GroupsTable != pgsql.ImportGroupsTable {
		t.Fatalf("RunsTable %q, GroupsTable %q; internal/pgsql names them %q, %q",
			RunsTable, GroupsTable, pgsql.ImportRunsTable, pgsql.ImportGroupsTable)
	}
}
