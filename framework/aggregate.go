package framework

import (
	"context"
	"fmt"
)

// Aggregate folds a stream's events into a state of type S. Declare it
// once per aggregate type and add a fold per event type with [Evolve].
type Aggregate[S any] struct {
	streamType string
	folds      map[string]func(s *S, env Envelope) error
	// defs holds the declaration each fold was added for.
	defs map[string]*eventDef
}

// NewAggregate declares the aggregate of the given stream type ("order").
func NewAggregate[S any](streamType string) *Aggregate[S] {
	return &Aggregate[S]{streamType: streamType, folds: map[string]func(*S, Envelope) error{}, defs: map[string]*eventDef{}}
}

// StreamType returns the aggregate's stream type.
func (a *Aggregate[S]) StreamType() string { return a.streamType }

// Stream returns the stream of the aggregate with this id.
func (a *Aggregate[S]) Stream(id string) Stream { return Stream{Type: a.streamType, ID: id} }

// Evolve adds the fold for event type ev. Events without a fold are skipped.
// It panics on an undeclared event type, a nil fold, or a second fold for
// the same declared type (which would replace the first); a fold for the
// same name declared in another registry (an aggregate in a package
// variable, registered once per registry) replaces it.
func Evolve[S, T any](a *Aggregate[S], ev EventType[T], fold func(s *S, e Event[T])) {
	def := ev.def
	if def == nil {
		panic("kumiko: Evolve with an undeclared event type")
	}
	if fold == nil {
		panic("kumiko: Evolve of aggregate " + a.streamType + ": nil fold for " + def.qualified)
	}
	if a.defs[def.qualified] == def {
		panic("kumiko: Evolve of aggregate " + a.streamType + ": a second fold for " + def.qualified)
	}
	a.defs[def.qualified] = def
	a.folds[def.qualified] = func(s *S, env Envelope) error {
		e, err := decodeEvent[T](def, env)
		if err != nil {
			return err
		}
		fold(s, e)
		return nil
	}
}

// Fold applies events to a zero state and returns it with the last version.
func (a *Aggregate[S]) Fold(events []Envelope) (S, int64, error) {
	var s S
	var version int64
	for _, env := range events {
		if f := a.folds[env.Type]; f != nil {
			if err := f(&s, env); err != nil {
				return s, version, fmt.Errorf("kumiko: fold %s/%s: %w", a.streamType, env.StreamID, err)
			}
		}
		version = env.Version
	}
	return s, version, nil
}

// Load folds the aggregate with this id as of asOf (zero: now) in tx and
// returns its state and version (0 when the stream does not exist).
func (a *Aggregate[S]) Load(ctx context.Context, tx *Tx, id string, asOf AsOf) (S, int64, error) {
	events, err := tx.ReadStream(ctx, a.Stream(id), asOf)
	if err != nil {
		var zero S
		return zero, 0, err
	}
	return a.Fold(events)
}

// LoadForWriting locks the stream (see [Tx.FetchForWriting]) and folds it;
// append with the returned version as the expected version.
func (a *Aggregate[S]) LoadForWriting(ctx context.Context, tx *Tx, id string) (S, int64, error) {
	events, version, err := tx.FetchForWriting(ctx, a.Stream(id))
	if err != nil {
		var zero S
		return zero, 0, err
	}
	s, _, err := a.Fold(events)
	return s, version, err
}
