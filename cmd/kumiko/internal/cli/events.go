package cli

import (
	"github.com/spf13/cobra"

	"github.com/kumiko-go/kumiko/framework"
)

// eventsCmd is the `kumiko events` command group.
func eventsCmd(register func(*framework.Registry)) *cobra.Command {
	_ = register
	return &cobra.Command{Use: "events", Short: "events operations (PLACEHOLDER: being implemented)"}
}
