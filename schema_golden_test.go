package pglease_test

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	pglease "github.com/pglease/watermill-pglease"
)

var updateGolden = flag.Bool("update-golden", false, "rewrite the golden files of testdata/ with the current output")

// goldenAdapter names every table, with a schema and names that need
// quoting, and a messages table long enough that the names derived from it
// (partitions, functions) are shortened and hashed.
func goldenAdapter() pglease.Tables {
	return pglease.Tables{
		Schema:                `My "App"`,
		MessagesTable:         "messages_with_a_rather_long_name_that_needs_shortening_xyz",
		ConsumerSessionsTable: "Sessions",
		ConsumerOffsetsTable:  "offsets's",
		SchemaVersionTable:    "version",
		TopicsTable:           "topics",
		DelayedTable:          "delayed",
		MaintenanceTable:      "maint",
		RetentionTable:        "retention",
	}
}

// TestSchemaSQLIsUnchanged compares SchemaSQL and GrantSQL with the files
// of testdata/, written by the release before the statements moved to
// internal/pgsql: the DDL users apply with their own tools, and the grants,
// must stay the same byte for byte unless a change is deliberate (then
// rerun with -update-golden and say so in the release notes).
func TestSchemaSQLIsUnchanged(t *testing.T) {
	for _, c := range []struct {
		file string
		got  string
	}{
		{"schema_default.sql", pglease.SchemaSQL(pglease.Tables{})},
		{"schema_custom.sql", pglease.SchemaSQL(goldenAdapter())},
		{"grant_default.sql", pglease.GrantSQL(pglease.Tables{}, "app")},
		{"grant_custom.sql", pglease.GrantSQL(goldenAdapter(), `App "Role"`)},
		{"grant_refused.sql", pglease.GrantSQL(pglease.Tables{}, "") + pglease.GrantSQL(pglease.Tables{}, "public")},
		{"grant_publisher_custom.sql", pglease.GrantPublisherSQL(goldenAdapter(), `App "Role"`)},
	} {
		path := filepath.Join("testdata", c.file)
		if *updateGolden {
			if err := os.WriteFile(path, []byte(c.got), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if c.got != string(want) {
			t.Errorf("%s: the output differs from the golden file (%d bytes, want %d); diff it with the file to see where", c.file, len(c.got), len(want))
			_ = os.WriteFile(path+".got", []byte(c.got), 0o644)
		}
	}
}
