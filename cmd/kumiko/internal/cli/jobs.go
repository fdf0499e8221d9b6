package cli

import (
	"github.com/spf13/cobra"

	"github.com/kumiko-go/kumiko/framework"
)

// jobsCmd is the `kumiko jobs` command group.
func jobsCmd(register func(*framework.Registry)) *cobra.Command {
	_ = register
	return &cobra.Command{Use: "jobs", Short: "jobs operations (PLACEHOLDER: being implemented)"}
}
