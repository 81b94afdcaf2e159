package pgtest

import (
	"context"
	"fmt"
	"strings"

	"effectively.dev/postgres"
)

// AppFaults makes a real PostgreSQL server answer an application error
// (an ERROR with a given SQLSTATE, such as 40001 serialization_failure,
// 40P01 deadlock_detected or 55P03 lock_not_available) on demand, the
// connection up, as it does when a transaction loses a race. A
// conformance harness arms it from its hook for conformance.Faults.SetAppFaulter.
//
// [InstallAppFaults] puts two triggers on each table it is given:
//
//   - a statement-level BEFORE INSERT OR UPDATE OR DELETE trigger, which
//     [AppFaults.FailNextWrite] arms: the next statement that writes one
//     of the tables fails before it writes a row;
//   - a deferred constraint trigger on each row written, which
//     [AppFaults.FailNextCommit] arms: the next COMMIT of a transaction
//     that wrote a row of one of the tables fails, as a serializable
//     transaction's COMMIT does when it lost a race.
//
// Either way the server answers the statement (or the COMMIT) with an
// ERROR and rolls the transaction back: nothing it did is committed.
// PostgreSQL never reports an ERROR for a transaction it committed, so
// there is no "applied, then failed" fault for it.
//
// A fault fires once, in whichever session writes (or commits) first,
// and stays armed until it fires or [AppFaults.Disarm] is called. The
// state lives in two sequences, which transactions do not roll back and
// every snapshot sees at once: an arming is seen by a transaction that
// was already running, whatever its isolation level, and a fired fault
// stays fired though its transaction rolled back. Each write statement
// (and each row written, at COMMIT) of the tables then costs one nextval.
type AppFaults struct {
	db postgres.DB
}

// The sequences hold the armed fault as a negative number, -(code+1),
// with code the SQLSTATE in base 36; nextval returns it once, then adds
// appFaultStep, which leaves every later value positive: disarmed.
const (
	appFaultWrite  = "pgtest_app_fault_write"
	appFaultCommit = "pgtest_app_fault_commit"
	appFaultStep   = 1_000_000_000 // more than 36^5, the largest code
)

// InstallAppFaults creates the sequences, the trigger function and the
// triggers on tables (each created once: installing again is harmless),
// disarmed, in db's database. It fails on a table that does not exist.
func InstallAppFaults(ctx context.Context, db postgres.DB, tables ...string) (*AppFaults, error) {
	stmts := []string{
		fmt.Sprintf(`CREATE SEQUENCE IF NOT EXISTS %s MINVALUE -%d INCREMENT %d START 1`, appFaultWrite, appFaultStep, appFaultStep),
		fmt.Sprintf(`CREATE SEQUENCE IF NOT EXISTS %s MINVALUE -%d INCREMENT %d START 1`, appFaultCommit, appFaultStep, appFaultStep),
		`CREATE OR REPLACE FUNCTION pgtest_app_fault() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
	v bigint := nextval(TG_ARGV[0]::regclass);
	code text := '';
	d int;
BEGIN
	IF v < 0 THEN
		v := -v - 1;
		FOR i IN 1..5 LOOP
			d := v % 36;
			code := substr('0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ', d + 1, 1) || code;
			v := v / 36;
		END LOOP;
		RAISE EXCEPTION 'pgtest: injected application error %', code USING ERRCODE = code;
	END IF;
	RETURN NULL;
END $$`,
	}
	for _, t := range tables {
		q := quoteIdent(t)
		stmts = append(stmts,
			fmt.Sprintf(`CREATE OR REPLACE TRIGGER pgtest_app_fault_write BEFORE INSERT OR UPDATE OR DELETE ON %s
				FOR EACH STATEMENT EXECUTE FUNCTION pgtest_app_fault('%s')`, q, appFaultWrite),
			fmt.Sprintf(`DROP TRIGGER IF EXISTS pgtest_app_fault_commit ON %s`, q),
			fmt.Sprintf(`CREATE CONSTRAINT TRIGGER pgtest_app_fault_commit AFTER INSERT OR UPDATE OR DELETE ON %s
				DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION pgtest_app_fault('%s')`, q, appFaultCommit))
	}
	for _, s := range stmts {
		if _, err := db.Exec(ctx, s); err != nil {
			return nil, fmt.Errorf("pgtest.InstallAppFaults: %w", err)
		}
	}
	a := &AppFaults{db: db}
	if err := a.Disarm(ctx); err != nil {
		return nil, err
	}
	return a, nil
}

// FailNextWrite makes the next statement that writes one of the tables
// fail with the SQLSTATE code (five characters, digits and capital
// letters), before it writes anything, in whatever session runs it.
func (a *AppFaults) FailNextWrite(ctx context.Context, code string) error {
	return a.arm(ctx, appFaultWrite, code)
}

// FailNextCommit makes the next COMMIT of a transaction that wrote a row
// of one of the tables fail with the SQLSTATE code, which rolls the
// transaction back.
func (a *AppFaults) FailNextCommit(ctx context.Context, code string) error {
	return a.arm(ctx, appFaultCommit, code)
}

// Disarm removes both faults, fired or not.
func (a *AppFaults) Disarm(ctx context.Context) error {
	if _, err := a.db.Exec(ctx, `SELECT setval($1::regclass, 1, false), setval($2::regclass, 1, false)`, appFaultWrite, appFaultCommit); err != nil {
		return fmt.Errorf("pgtest.AppFaults.Disarm: %w", err)
	}
	return nil
}

func (a *AppFaults) arm(ctx context.Context, seq, code string) error {
	n, err := sqlstateNumber(code)
	if err != nil {
		return err
	}
	if _, err := a.db.Exec(ctx, `SELECT setval($1::regclass, $2, false)`, seq, -n-1); err != nil {
		return fmt.Errorf("pgtest.AppFaults: arming %s: %w", code, err)
	}
	return nil
}

// sqlstateNumber reads a SQLSTATE as a number in base 36.
func sqlstateNumber(code string) (int64, error) {
	const digits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	if len(code) != 5 {
		return 0, fmt.Errorf("pgtest.AppFaults: %q is not a SQLSTATE (five digits or capital letters)", code)
	}
	var n int64
	for _, c := range code {
		d := strings.IndexRune(digits, c)
		if d < 0 {
			return 0, fmt.Errorf("pgtest.AppFaults: %q is not a SQLSTATE (five digits or capital letters)", code)
		}
		n = n*36 + int64(d)
	}
	return n, nil
}

// quoteIdent quotes a table name, each dot-separated part on its own.
func quoteIdent(name string) string {
	parts := strings.Split(name, ".")
	for i, p := range parts {
		parts[i] = `"` + strings.ReplaceAll(p, `"`, `""`) + `"`
	}
	return strings.Join(parts, ".")
}
