package effects

import (
	"context"
	"errors"
	"fmt"
)

// Checker is implemented by an effect (a source, a journal) that can probe
// its configuration cheaply before the first delivery: an authenticated
// read of the vendor's API, a HEAD of the bucket, the tables and settings
// of the database, the topics and group of a broker.
//
// Check returns nil when the configuration works; a *[ConfigError] naming
// the setting when it cannot ([InvalidConfig]: a wrong credential, a missing
// bucket, table or topic); or a retryable error when the owner could not
// be reached now (a refused connection: the configuration may be right).
// It changes nothing that an Apply would see.
type Checker interface {
	Check(ctx context.Context) error
}

// Check runs the Check of every step whose effect is a [Checker], in plan
// order, and returns their failures joined (errors.Join), each a
// *[StepError] naming the step (with no key) whose text says it is the
// start-up check that failed. It returns nil when every check passed or
// no step can check. Run it at start-up, before the first delivery: a
// configuration error found here stops the worker before any step of any
// event ran.
func (p *Plan[E]) Check(ctx context.Context) error {
	var errs []error
	for _, s := range p.steps {
		if s.check == nil {
			continue
		}
		if err := s.check.Check(ctx); err != nil {
			errs = append(errs, &StepError{Step: s.name, Err: fmt.Errorf("start-up check failed: %w", err)})
		}
	}
	return errors.Join(errs...)
}
