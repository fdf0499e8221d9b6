// Package features lists the sample features the kumiko binary serves. An
// application of its own writes the same few lines with its features.
package features

import (
	"github.com/kumiko-go/kumiko/features/demo"
	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/features/users"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/web"
)

// Register adds every sample feature to r.
func Register(r *framework.Registry) {
	orders.Register(r)
	users.Register(r)
}

// Routes adds the sample app's own pages to the HTTP server: the demo page
// at / (orders placed and listed live over SSE).
func Routes(s *web.Server) {
	demo.Mount(s)
}
