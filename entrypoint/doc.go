// Package entrypoint builds a Kumiko process from configuration and a
// feature list: the API process, the worker, or both in one (APP_MODE), with
// the lifecycle starting → ready → draining → stopped.
//
// What each mode runs (ARCHITECTURE.md §7):
//
//	mode        HTTP API   shared consumers          per-instance consumers
//	api         yes        runIn api/both            yes
//	worker      health     runIn worker/both         no
//	all-in-one  yes        all                       yes
package entrypoint
