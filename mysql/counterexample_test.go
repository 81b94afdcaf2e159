package mysql_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"effectively.dev/conformance"
	"effectively.dev/effects"
	"effectively.dev/mysql"
)

// postgresMindedKey is the key column an honest port of the postgres
// schema writes on MySQL: text becomes VARCHAR(255), in the database's
// default collation, which is case- and accent-insensitive on MariaDB
// (utf8mb4_general_ci) and MySQL 8 (utf8mb4_0900_ai_ci).
const postgresMindedKey = "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL"

// TestConformanceCatchesCaseInsensitiveKeys: the adapter over a
// case-insensitive key column fails the suite's distinct-keys scenario
// ("Order-7" and "order-7" are one dedup row, so the second message is
// never applied), and Check refuses the table at start-up.
func TestConformanceCatchesCaseInsensitiveKeys(t *testing.T) {
	rep := conformance.Run(t, "mysql (key VARCHAR utf8mb4_general_ci)", func(t testing.TB) conformance.Harness[confCharge] {
		return newConfHarness(t, "MODIFY `key` "+postgresMindedKey)
	}, conformance.Only(conformance.ScenarioDistinctKeys), conformance.WithRetryFor(500*time.Millisecond), conformance.ReportOnly())
	row, _ := rep.Row(conformance.ScenarioDistinctKeys)
	if row.Verdict != conformance.Fail {
		t.Fatalf("distinct-keys over a case-insensitive key column: %s, want FAIL", row.Verdict)
	}
	t.Logf("caught: %v", row.Failures)

	checkRefuses(t, "MODIFY `key` "+postgresMindedKey, "key varchar(255) COLLATE utf8mb4_general_ci")
}

// checkRefuses checks that Check refuses effectively_keys altered by
// alter, with a ConfigError that says why (want).
func checkRefuses(t *testing.T, alter, want string) {
	t.Helper()
	db, _ := newDB(t)
	if _, err := db.ExecContext(testCtx(t), "ALTER TABLE effectively_keys "+alter); err != nil {
		t.Fatal(err)
	}
	eff, err := mysql.New(db, "s", writeLedger)
	if err != nil {
		t.Fatal(err)
	}
	var cfg *effects.ConfigError
	if err := eff.Check(testCtx(t)); !errors.As(err, &cfg) || !strings.Contains(err.Error(), want) {
		t.Errorf("Check after ALTER TABLE effectively_keys %s: %v, want a *effects.ConfigError saying %q", alter, err, want)
	}
}

// TestScopesDifferingInTrailingSpace: scopes "tenant" and "tenant " are
// two scopes. In a utf8mb4_bin column, PAD SPACE in MariaDB and MySQL 5.7,
// they compare equal, and the second tenant's payment replays the first
// one's: the test shows that, and that the VARBINARY schema keeps them
// apart. (Keys cannot end in a space: effects.Key refuses them, so the
// conformance suite has no trailing-space pair of keys; scopes are the
// adapter's to keep apart.)
func TestScopesDifferingInTrailingSpace(t *testing.T) {
	for _, tc := range []struct {
		name        string
		scopeColumn string // "" keeps the schema's VARBINARY
		wantApplied bool
	}{
		{"VARBINARY", "", true},
		{"utf8mb4_bin (PAD SPACE)", "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, _ := newDB(t)
			ctx := testCtx(t)
			if tc.scopeColumn != "" {
				if _, err := db.ExecContext(ctx, "ALTER TABLE effectively_keys MODIFY scope "+tc.scopeColumn); err != nil {
					t.Fatal(err)
				}
			}
			key := effects.MustKey("evt-1")
			for i, scope := range []string{"tenant", "tenant "} {
				eff, err := mysql.New(db, scope, writeLedger)
				if err != nil {
					t.Fatal(err)
				}
				res, err := eff.Apply(ctx, key, payment{EventID: scope + "/evt-1", Amount: 100})
				applied := err == nil && res.Status == effects.Applied
				if i == 1 && applied != tc.wantApplied {
					t.Errorf("scope %q after scope %q: (%v, %v), applied %t, want %t", scope, "tenant", res.Status, err, applied, tc.wantApplied)
				}
			}
			if n := ledgerRows(t, db, "tenant /evt-1"); (n == 1) != tc.wantApplied {
				t.Errorf("the second scope's payment was written %d times, want applied=%t", n, tc.wantApplied)
			}
		})
	}
}

// TestConformanceCatchesMyISAMKeys: the key table in MyISAM, which has no
// transactions, keeps a key whose transaction never committed (COMMIT
// never reached the server, the connection dropped and the write rolled
// back): the retry replays an effect that does not exist. The suite's
// cut-request sweep catches it, and Check refuses the table.
func TestConformanceCatchesMyISAMKeys(t *testing.T) {
	rep := conformance.Run(t, "mysql (effectively_keys ENGINE=MyISAM)", func(t testing.TB) conformance.Harness[confCharge] {
		return newConfHarness(t, "ENGINE=MyISAM")
	}, conformance.Only(conformance.ScenarioCut), conformance.ReportOnly())
	row, _ := rep.Row(conformance.ScenarioCut)
	if row.Verdict != conformance.Fail {
		t.Fatalf("cut-request over a MyISAM key table: %s, want FAIL", row.Verdict)
	}
	t.Logf("caught: %v", row.Failures[0])

	checkRefuses(t, "ENGINE=MyISAM", "is MyISAM, not InnoDB")
}
