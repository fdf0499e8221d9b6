package cli

import (
	"github.com/spf13/cobra"

	"github.com/kumiko-go/kumiko/framework"
)

// projectionCmd is the `kumiko projection` command group.
func projectionCmd(register func(*framework.Registry)) *cobra.Command {
	_ = register
	return &cobra.Command{Use: "projection", Short: "projection operations (PLACEHOLDER: being implemented)"}
}
