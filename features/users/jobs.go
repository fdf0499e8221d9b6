package users

import (
	"cmp"
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
)

// Mail is one mail handed to a [Sender].
type Mail struct {
	UserID  string
	To      string
	Subject string
	Body    string
}

// Sender delivers mails. tx is the job's transaction: a sender that records
// what it sent (like the sample's) writes there, so the record commits with
// the job's HandledOnce claim; one that calls a mail service ignores it.
type Sender interface {
	Send(ctx context.Context, tx *framework.Tx, m Mail) error
}

// TableSender is the sample sender: it writes every mail to the sent_mail
// table (a test can count them) instead of delivering it.
type TableSender struct{}

// Send records m in sent_mail.
func (TableSender) Send(ctx context.Context, tx *framework.Tx, m Mail) error {
	_, err := tx.Exec(ctx, `INSERT INTO sent_mail (tenant_id, user_id, to_address, subject, body) VALUES ($1, $2, $3, $4, $5)`,
		tx.TenantID(), m.UserID, m.To, m.Subject, m.Body)
	return err
}

// SentMailInput is the (empty) payload of users:query:sent-mail.
type SentMailInput struct{}

// SentMail is one row of users:query:sent-mail.
type SentMail struct {
	ID      int64     `json:"id"`
	UserID  string    `json:"userId"`
	To      string    `json:"to"`
	Subject string    `json:"subject"`
	SentAt  time.Time `json:"sentAt"`
}

// DefaultNightlyReportSpec is the schedule of users:job:nightly-report when
// [Options.NightlyReportSpec] is empty: 02:00 UTC.
const DefaultNightlyReportSpec = "0 2 * * *"

// registerJobs adds deliver-welcome-mail (worker lane, on users:event:invited),
// the sent-mail query and the nightly-report cron job (on spec).
func registerJobs(f *framework.Feature, ft *Feature, sender Sender, spec string) {
	jobs.OnEvent(f, "deliver-welcome-mail", ft.Invited, nil, func(ctx context.Context, jc *jobs.Context, e framework.Event[Invited]) error {
		return jc.InTx(ctx, func(ctx context.Context, tx *framework.Tx) error {
			first, err := jobs.HandledOnce(ctx, tx, "welcome-mail:"+e.Payload.UserID)
			if err != nil || !first {
				return err
			}
			return sender.Send(ctx, tx, Mail{
				UserID:  e.Payload.UserID,
				To:      e.Payload.Email,
				Subject: "Welcome!",
				Body:    "You were invited by " + e.Payload.InvitedBy + ".",
			})
		})
	})

	framework.Query(f, "sent-mail", func(ctx context.Context, tx *framework.Tx, _ SentMailInput) ([]SentMail, error) {
		rows, err := tx.Query(ctx, `SELECT id, user_id::text, to_address, subject, sent_at FROM sent_mail ORDER BY id LIMIT 1000`)
		if err != nil {
			return nil, err
		}
		out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SentMail, error) {
			var m SentMail
			err := r.Scan(&m.ID, &m.UserID, &m.To, &m.Subject, &m.SentAt)
			return m, err
		})
		if out == nil {
			out = []SentMail{}
		}
		return out, err
	}, nil)

	// nightly-report runs once per tick however many workers run the
	// scheduler (the tick's task id is derived from the job and the tick)
	// and however often asynq delivers the run (see nightlyReport).
	jobs.Cron(f, "nightly-report", cmp.Or(spec, DefaultNightlyReportSpec), nil, func(ctx context.Context, jc *jobs.Context, t jobs.Tick) error {
		return jc.InTx(ctx, func(ctx context.Context, tx *framework.Tx) error { return nightlyReport(ctx, tx, t) })
	})
}

// nightlyReport writes the report of tick t in tx (the system tenant's,
// which sees every tenant's users), once per tick. The task id keeps
// several schedulers from enqueueing a tick twice, but asynq delivers a run
// at least once: a worker that dies after the commit and before asynq
// records the success runs it again. The tick's HandledOnce claim commits
// with the report, so such a run writes nothing.
func nightlyReport(ctx context.Context, tx *framework.Tx, t jobs.Tick) error {
	first, err := jobs.HandledOnce(ctx, tx, "nightly-report:"+t.Time.UTC().Format(time.RFC3339Nano))
	if err != nil || !first {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO nightly_reports (tick, tenants, users)
		SELECT $1, count(DISTINCT tenant_id), count(*) FROM users`, t.Time)
	return err
}
