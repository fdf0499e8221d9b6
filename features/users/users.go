// Package users is the sample feature of invitations: inviting a user
// appends users:event:invited, and the side-effect projection
// send-welcome-email reacts to it after commit. It uses only the public
// framework API.
package users

import (
	"context"

	"github.com/google/uuid"

	"github.com/kumiko-go/kumiko/framework"
)

// Invited is the payload of users:event:invited.
type Invited struct {
	UserID    string `json:"userId" validate:"required,uuid"`
	Email     string `json:"email" validate:"required,email"`
	InvitedBy string `json:"invitedBy" validate:"required"`
}

// InviteInput is the payload of users:write:invite.
type InviteInput struct {
	Email string `json:"email" validate:"required,email,max=320"`
}

// InviteResult answers users:write:invite.
type InviteResult struct {
	ID      string `json:"id"`
	Version int64  `json:"version"`
}

// Feature is the registered users feature.
type Feature struct {
	// Invited is users:event:invited.
	Invited framework.EventType[Invited]
}

// StreamType is the aggregate type of a user's stream ("user/<id>").
const StreamType = "user"

// Options configure the users feature. A nil *Options means the defaults.
type Options struct {
	// NightlyReportSpec is the schedule of users:job:nightly-report, a spec
	// that jobs.Cron accepts. Defaults to [DefaultNightlyReportSpec].
	NightlyReportSpec string
}

// Register adds the users feature to r with the default options.
func Register(r *framework.Registry) *Feature { return RegisterWith(r, nil) }

// RegisterWith adds the users feature to r with opts (nil means the
// defaults).
func RegisterWith(r *framework.Registry, opts *Options) *Feature {
	if opts == nil {
		opts = &Options{}
	}
	f := r.Feature("users")
	ft := &Feature{Invited: framework.DefineEvent[Invited](f, "invited", nil)}

	framework.Write(f, "invite", func(ctx context.Context, tx *framework.Tx, in InviteInput) (InviteResult, error) {
		id := uuid.Must(uuid.NewV7()).String()
		if _, err := tx.Exec(ctx, `INSERT INTO users (tenant_id, id, email, invited_by) VALUES ($1, $2, $3, $4)`,
			tx.TenantID(), id, in.Email, tx.UserID()); err != nil {
			return InviteResult{}, err
		}
		err := tx.Append(framework.Stream{Type: StreamType, ID: id}, framework.NoStream,
			ft.Invited.With(Invited{UserID: id, Email: in.Email, InvitedBy: tx.UserID()}))
		return InviteResult{ID: id, Version: 1}, err
	}, nil)

	// send-welcome-email is a side-effect-only consumer (no table of its
	// own to rebuild). Its log insert is idempotent on the user id, the
	// pattern for handlers that may see an event twice.
	p := framework.MultiStreamProjection(f, "send-welcome-email", nil)
	framework.On(p, ft.Invited, func(ctx context.Context, tx *framework.Tx, e framework.Event[Invited]) error {
		_, err := tx.Exec(ctx, `INSERT INTO welcome_log (tenant_id, user_id, email) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`,
			e.TenantID, e.Payload.UserID, e.Payload.Email)
		return err
	})
	registerJobs(f, ft, TableSender{}, opts.NightlyReportSpec)
	return ft
}
