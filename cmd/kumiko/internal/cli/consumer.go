package cli

import (
	"github.com/spf13/cobra"

	"github.com/kumiko-go/kumiko/framework"
)

// consumerCmd is the `kumiko consumer` command group.
func consumerCmd(register func(*framework.Registry)) *cobra.Command {
	_ = register
	return &cobra.Command{Use: "consumer", Short: "consumer operations (PLACEHOLDER: being implemented)"}
}
