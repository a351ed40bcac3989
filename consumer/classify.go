package consumer

import (
	"errors"
	"time"

	"github.com/idem-dev/idem"
)

// classifierFor builds the classification applied to handler errors:
// idem.ClassifyError (driver-independent: dial errors, resets, timeouts),
// then the guard's store's own (idem.ErrorClassifier: its driver's error
// codes, for effects in the same database), then Config.ClassifyError.
func classifierFor(cfg Config) func(error) error {
	fs := []func(error) error{idem.ClassifyError}
	if ec, ok := cfg.Guard.Store().(idem.ErrorClassifier); ok {
		fs = append(fs, ec.ClassifyError)
	}
	if cfg.ClassifyError != nil {
		fs = append(fs, cfg.ClassifyError)
	}
	return func(err error) error {
		for _, f := range fs {
			if err == nil {
				return nil
			}
			if e := f(err); e != nil {
				err = e
			}
		}
		return err
	}
}

// classify maps a handler's error onto idem's sentinels.
func (c *Consumer) classify(err error) error {
	if err == nil {
		return nil
	}
	return c.classifier(err)
}

// transient reports a classified handler error that says "not now" rather
// than "failed": the handler's system (or the store) could not be reached
// (idem.ErrUnavailable), the outcome is unknown (idem.ErrUnknownOutcome),
// or a key it needs is held by someone else (idem.ErrInProgress, e.g. a
// step of Steps). Such an error holds the message and spends no attempt.
// A Permanent mark wins.
func (c *Consumer) transient(err error) bool {
	if err == nil || idem.IsPermanent(err) {
		return false
	}
	return errors.Is(err, idem.ErrUnavailable) || errors.Is(err, idem.ErrUnknownOutcome) || errors.Is(err, idem.ErrInProgress)
}

// transientWait is how long to wait before retrying after a transient
// error: the holder's remaining lease for an in-progress key, else 0 (the
// hold backoff).
func transientWait(err error) time.Duration {
	var ip *idem.InProgressError
	if errors.As(err, &ip) && !errors.Is(err, idem.ErrUnavailable) {
		return ip.RetryAfter(time.Now())
	}
	return 0
}
