# Kumiko for Go. `make help` lists the targets.
SHELL := /usr/bin/env bash
GO ?= go
export PATH := $(PATH):/usr/local/go/bin

# Local development defaults; override them in the environment.
DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/kumiko?sslmode=disable
REDIS_URL ?= redis://127.0.0.1:6379/0
JWT_SECRET ?= dev-only-secret-change-me-0123456789
HTTP_ADDR ?= :8080
export DATABASE_URL REDIS_URL JWT_SECRET HTTP_ADDR

.PHONY: help run test bench bench-go lint tidy migrate build services

help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## Build the kumiko binary into bin/.
	$(GO) build -o bin/kumiko ./cmd/kumiko

services: ## Check that Postgres and Redis answer (start docker compose where it can).
	@up() { (exec 3<>"/dev/tcp/127.0.0.1/$$1") 2>/dev/null; }; \
	down=""; up 5432 || down=" postgres"; up 6379 || down="$$down redis"; \
	if [ -n "$$down" ] && command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then \
	  echo "starting$$down with docker compose"; docker compose up -d --wait $$down; \
	  for i in $$(seq 1 60); do up 5432 && up 6379 && break; sleep 1; done; \
	fi; \
	missing=""; up 5432 || missing="$$missing\n  - PostgreSQL on 127.0.0.1:5432"; \
	up 6379 || missing="$$missing\n  - Redis on 127.0.0.1:6379"; \
	if [ -n "$$missing" ]; then \
	  printf "kumiko: not answering:$$missing\nstart them (or a Docker engine, for docker compose) and run make again\n" >&2; exit 1; \
	fi

run: build services ## Migrate and start the sample app (all-in-one, :8080, KUMIKO_DEV=1).
	./bin/kumiko migrate
	APP_MODE=all-in-one KUMIKO_DEV=1 ./bin/kumiko serve

migrate: build ## Apply pending migrations to DATABASE_URL.
	./bin/kumiko migrate

test: ## Run every test (real Postgres and Redis, race detector).
	$(GO) test -race -count=1 -timeout 30m ./...

bench: ## Run the benchmarks, each against its baseline, and print the ratios.
	$(GO) run ./cmd/kumiko-bench

bench-go: ## Run the go test benchmarks beside the code (each beside its baseline sub-benchmark).
	$(GO) test -run '^$$' -bench . -benchmem ./...

STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

lint: ## gofmt, go vet and staticcheck.
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

tidy: ## go mod tidy.
	$(GO) mod tidy
