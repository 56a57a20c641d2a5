package pglease

import (
	"testing"

	"github.com/pglease/watermill-pglease/internal/pgsql"
)

// The import's own tables are named in the API (ImportRunsTable,
// ImportGroupsTable) and in the statements of internal/pgsql.
func TestImportTableNamesMatchStatements(t *testing.T) {
	if ImportRunsTable != pgsql.ImportRunsTable || ImportGroupsTable != pgsql.ImportGroupsTable {
		t.Fatalf("ImportRunsTable %q, ImportGroupsTable %q; internal/pgsql names them %q, %q",
			ImportRunsTable, ImportGroupsTable, pgsql.ImportRunsTable, pgsql.ImportGroupsTable)
	}
}
