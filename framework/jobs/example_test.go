package jobs_test

import (
	"context"
	"fmt"
	"time"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
)

type orderPlaced struct {
	OrderID string `json:"orderId" validate:"required"`
}

type exportRequest struct {
	Month string `json:"month" validate:"required,len=7"`
}

// A feature declares its jobs next to its handlers: one triggered by an
// event, one by a schedule, one by dispatch.
func Example() {
	reg := framework.NewRegistry()
	f := reg.Feature("shop")
	placed := framework.DefineEvent[orderPlaced](f, "placed", nil)

	jobs.OnEvent(f, "send-receipt", placed, &jobs.Options{MaxRetries: 5},
		func(ctx context.Context, jc *jobs.Context, e framework.Event[orderPlaced]) error {
			return jc.InTx(ctx, func(ctx context.Context, tx *framework.Tx) error {
				first, err := jobs.HandledOnce(ctx, tx, "receipt:"+e.Payload.OrderID)
				if err != nil || !first {
					return err
				}
				// ... hand the receipt to the mailer ...
				return nil
			})
		})
	berlin, _ := time.LoadLocation("Europe/Berlin")
	jobs.Cron(f, "close-day", "0 23 * * *", &jobs.Options{Location: berlin},
		func(ctx context.Context, jc *jobs.Context, t jobs.Tick) error { return nil })
	export := jobs.Manual[exportRequest](f, "export", &jobs.Options{Timeout: 10 * time.Minute},
		func(ctx context.Context, jc *jobs.Context, in exportRequest) error { return nil })

	// In a write handler: enqueue as part of the transaction.
	framework.Write(f, "request-export", func(ctx context.Context, tx *framework.Tx, in exportRequest) (string, error) {
		return "queued", export.DispatchTx(ctx, tx, in, &jobs.DispatchOptions{Key: "export:" + in.Month})
	}, nil)

	fmt.Println(reg.Build())
	for _, j := range jobs.For(reg).Jobs() {
		fmt.Println(j.Name(), j.Trigger(), j.RunIn())
	}
	// Output:
	// <nil>
	// shop:job:close-day cron worker
	// shop:job:export manual worker
	// shop:job:send-receipt event worker
}

// runIn both is refused when the registry is built.
func Example_runInBoth() {
	reg := framework.NewRegistry()
	jobs.Manual[exportRequest](reg.Feature("shop"), "sync", &jobs.Options{RunIn: framework.RunInBoth},
		func(ctx context.Context, jc *jobs.Context, in exportRequest) error { return nil })
	fmt.Println(reg.Build())
	// Output:
	// kumiko: job shop:job:sync: runIn both is not allowed: a job runs in exactly one lane, choose api or worker
}
