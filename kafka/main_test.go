package kafka_test

import (
	"os"
	"testing"

	"effectively.dev/postgres/pgtest"
)

// TestMain stops the shared PostgreSQL cluster after the tests and, with
// goleak (pgtest.Main), fails the run if any goroutine outlived them: a kgo
// client, a kfake cluster or a pgx pool left open.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
