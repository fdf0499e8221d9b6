package config

import (
	"bufio"
	"net"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/kumiko-go/kumiko/framework/web"
)

// The files an operator touches first (README, docker-compose.yml,
// Makefile) and this package's own documentation must agree with what
// FromLookup reads. These tests read them from the repository root.

// readVariables returns the names FromLookup asks for, in order: the
// variables the package reads, taken from the code rather than from a list.
func readVariables(t *testing.T) []string {
	t.Helper()
	var names []string
	_, _ = FromLookup(func(name string) (string, bool) {
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
		return "", false
	})
	require.NotEmpty(t, names)
	return names
}

// docRow is one variable of a documentation table: its name and the
// default column, backticks removed.
type docRow struct {
	name, def string
}

var readmeRow = regexp.MustCompile("^\\| `([A-Z][A-Z0-9_]*)` \\| ([^|]*) \\|")

// readmeConfigTable returns the rows of the README's "## Configuration" table.
func readmeConfigTable(t *testing.T) []docRow {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(b), "\n## Configuration\n")
	require.True(t, ok, "README.md has no ## Configuration section")
	section, _, _ = strings.Cut(section, "\n## ")
	var rows []docRow
	for line := range strings.Lines(section) {
		if m := readmeRow.FindStringSubmatch(line); m != nil {
			rows = append(rows, docRow{name: m[1], def: strings.TrimSpace(strings.ReplaceAll(m[2], "`", ""))})
		}
	}
	require.NotEmpty(t, rows, "README.md: no variable table under ## Configuration")
	return rows
}

var docGoRow = regexp.MustCompile(`^//\t([A-Z][A-Z0-9_]*)\s+(\S.*?)\s{2,}`)

// docGoTable returns the rows of the "# Variables" table of doc.go.
func docGoTable(t *testing.T) []docRow {
	t.Helper()
	f, err := os.Open("doc.go")
	require.NoError(t, err)
	defer f.Close()
	var rows []docRow
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "// # Variables":
			in = true
		case in && strings.HasPrefix(line, "// # "):
			in = false
		case in:
			// The header row ("Variable  Default  Field") is skipped: its
			// first word is not a variable name.
			if m := docGoRow.FindStringSubmatch(line); m != nil && m[1] != "Variable" {
				rows = append(rows, docRow{name: m[1], def: m[2]})
			}
		}
	}
	require.NoError(t, sc.Err())
	require.NotEmpty(t, rows, "doc.go: no # Variables table")
	return rows
}

// checkDocumentedDefaults checks that rows name exactly the variables read
// and that each documented default is the one FromLookup applies.
func checkDocumentedDefaults(t *testing.T, where string, rows []docRow) {
	t.Helper()
	var names []string
	for _, r := range rows {
		names = append(names, r.name)
	}
	require.ElementsMatch(t, readVariables(t), names, "%s documents other variables than config reads", where)

	base, err := FromLookup(env(minimal(nil)))
	require.NoError(t, err)
	for _, r := range rows {
		switch {
		case strings.HasPrefix(r.def, "required"):
			m := minimal(nil)
			delete(m, r.name)
			_, err := FromLookup(env(m))
			require.Error(t, err, "%s: %s is documented as required", where, r.name)
			require.Contains(t, varNames(t, err), r.name, "%s: %s is documented as required", where, r.name)
			if strings.Contains(r.def, "worker") { // "required (not for worker)", "required unless worker"
				m["APP_MODE"] = string(ModeWorker)
				_, err := FromLookup(env(m))
				require.NoError(t, err, "%s: %s is documented as optional for a worker", where, r.name)
			}
		case r.def == "random" || strings.HasPrefix(r.def, "unset"):
			// No default value: setting it must change the configuration
			// (checked by TestEveryVariableParsed); unset leaves the field
			// at its zero value.
			got := fieldOf(t, base, r.name)
			require.True(t, got.IsZero(), "%s: %s is documented as unset by default, config has %v", where, r.name, got)
		default:
			def := r.def
			if i := strings.Index(def, " "); i > 0 { // "24h (at least 30s)": the value is the first word
				def = def[:i]
			}
			c, err := FromLookup(env(minimal(map[string]string{r.name: def})))
			require.NoError(t, err, "%s: the documented default %s=%q is refused", where, r.name, def)
			require.Equal(t, base, c, "%s: %s=%q is documented as the default but is not what config applies when it is unset", where, r.name, def)
		}
	}
}

// fieldOf returns the Config field a variable sets, found by setting it to
// a valid non-default value and comparing.
func fieldOf(t *testing.T, c *Config, name string) reflect.Value {
	t.Helper()
	sample := map[string]string{
		"DATABASE_READ_URL":  "postgres://replica.example.com/kumiko",
		"KUMIKO_INSTANCE_ID": "api-1",
		"KUMIKO_SAMPLE_CRON": "@every 2s",
	}
	v, ok := sample[name]
	require.True(t, ok, "no sample value for %s", name)
	set, err := FromLookup(env(minimal(map[string]string{name: v})))
	require.NoError(t, err)
	cv, sv := reflect.ValueOf(c).Elem(), reflect.ValueOf(set).Elem()
	for i := range cv.NumField() {
		if !reflect.DeepEqual(cv.Field(i).Interface(), sv.Field(i).Interface()) {
			return cv.Field(i)
		}
	}
	t.Fatalf("setting %s changes no field", name)
	return reflect.Value{}
}

func TestREADMEDocumentsEveryVariable(t *testing.T) {
	t.Parallel()
	checkDocumentedDefaults(t, "README.md ## Configuration", readmeConfigTable(t))
}

func TestDocGoDocumentsEveryVariable(t *testing.T) {
	t.Parallel()
	checkDocumentedDefaults(t, "doc.go # Variables", docGoTable(t))
}

// composeFile is the part of docker-compose.yml the test checks.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Configs  map[string]struct {
		Content string `yaml:"content"`
	} `yaml:"configs"`
}

type composeService struct {
	Image           string                                `yaml:"image"`
	Build           any                                   `yaml:"build"`
	Command         []string                              `yaml:"command"`
	Environment     map[string]string                     `yaml:"environment"`
	DependsOn       map[string]struct{ Condition string } `yaml:"depends_on"`
	StopGracePeriod string                                `yaml:"stop_grace_period"`
	Restart         string                                `yaml:"restart"`
	Healthcheck     *struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
}

// interpolate resolves compose's ${NAME:-default} and ${NAME-default} to
// their defaults, as in an environment that sets none of them.
var composeVar = regexp.MustCompile(`\$\{[A-Za-z_][A-Za-z0-9_]*:?-([^}]*)\}`)

func interpolate(s string) string { return composeVar.ReplaceAllString(s, "$1") }

// port returns the port of a listen address.
func port(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	return p
}

var healthcheckTarget = regexp.MustCompile(`/dev/tcp/127\.0\.0\.1/(\d+)\b.*GET (/\S+) `)

func TestDockerComposeMatchesConfig(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../docker-compose.yml")
	require.NoError(t, err)
	var f composeFile
	require.NoError(t, yaml.Unmarshal(b, &f))
	known := readVariables(t)

	serving := 0
	httpPorts := map[string]string{} // api and all-in-one services: HTTP port
	for name, s := range f.Services {
		if s.Build == nil && !strings.HasPrefix(s.Image, "kumiko") {
			continue // postgres, redis, the load balancer
		}
		require.NotEmpty(t, s.Command, "%s: no command", name)
		m := map[string]string{}
		for k, v := range s.Environment {
			require.Contains(t, known, k, "%s: config reads no %s", name, k)
			m[k] = interpolate(v)
		}
		// The hosts of the connection strings are services of the file.
		urls, err := FromLookup(env(map[string]string{
			"APP_MODE": string(ModeWorker), "DATABASE_URL": m["DATABASE_URL"], "REDIS_URL": m["REDIS_URL"],
		}))
		require.NoError(t, err, "%s", name)
		pool, err := urls.PoolConfig()
		require.NoError(t, err)
		require.Contains(t, f.Services, pool.ConnConfig.Host, "%s: DATABASE_URL names no service", name)
		opts, err := urls.RedisOptions()
		require.NoError(t, err)
		redisHost, _, err := net.SplitHostPort(opts.Addr)
		require.NoError(t, err)
		require.Contains(t, f.Services, redisHost, "%s: REDIS_URL names no service", name)

		switch s.Command[0] {
		case "migrate":
			// kumiko migrate reads the configuration as a worker would
			// (LoadForTool).
			m["APP_MODE"] = string(ModeWorker)
			_, err := FromLookup(env(m))
			require.NoError(t, err, "%s: kumiko migrate would refuse this environment", name)
			require.Equal(t, "no", s.Restart, "%s: a one-shot migration must not restart", name)
			pg := s.DependsOn["postgres"]
			require.Equal(t, "service_healthy", pg.Condition, "%s: must wait for a healthy postgres", name)
		case "serve":
			serving++
			c, err := FromLookup(env(m))
			require.NoError(t, err, "%s: kumiko serve would refuse this environment", name)
			// Migrations first: serve never migrates.
			require.Equal(t, "service_completed_successfully", s.DependsOn["migrate"].Condition,
				"%s: must start after the migrate service completed", name)
			// The healthcheck asks for readiness on the port the mode listens on.
			require.NotNil(t, s.Healthcheck, "%s: no healthcheck", name)
			hc := healthcheckTarget.FindStringSubmatch(strings.Join(s.Healthcheck.Test, " "))
			require.NotNil(t, hc, "%s: healthcheck %q asks no local port", name, s.Healthcheck.Test)
			want := c.HTTPAddr
			if c.Mode == ModeWorker {
				want = c.WorkerHTTPAddr
			} else {
				httpPorts[name] = port(t, c.HTTPAddr)
			}
			require.Equal(t, port(t, want), hc[1], "%s (APP_MODE %s): the healthcheck asks the wrong port", name, c.Mode)
			require.Equal(t, "/health/ready", hc[2], "%s: the healthcheck asks the wrong path", name)
			// The container gets the whole drain before SIGKILL.
			grace, err := time.ParseDuration(s.StopGracePeriod)
			require.NoError(t, err, "%s: stop_grace_period", name)
			require.Greater(t, grace, c.DrainTimeout, "%s: stop_grace_period must exceed KUMIKO_DRAIN_TIMEOUT_MS", name)
		default:
			t.Errorf("%s: command %q is neither serve nor migrate", name, s.Command)
		}
	}
	require.NotZero(t, serving, "no service runs kumiko serve")

	// The load balancer's upstreams are the API services, on their HTTP ports.
	lb, ok := f.Configs["lb"]
	require.True(t, ok, "no lb config")
	upstream := regexp.MustCompile(`(?m)^\s*server\s+([a-z0-9_-]+):(\d+)`)
	servers := upstream.FindAllStringSubmatch(lb.Content, -1)
	require.NotEmpty(t, servers, "the load balancer has no upstream server")
	for _, s := range servers {
		p, ok := httpPorts[s[1]]
		require.True(t, ok, "upstream %s is no api service", s[1])
		require.Equal(t, p, s[2], "upstream %s: HTTP_ADDR listens on %s", s[1], p)
	}
}

var makeDefault = regexp.MustCompile(`(?m)^([A-Z][A-Z0-9_]*) \?= (.*)$`)

func TestMakefileEnvironmentMatchesConfig(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../Makefile")
	require.NoError(t, err)
	known := readVariables(t)
	m := map[string]string{}
	for _, d := range makeDefault.FindAllStringSubmatch(string(b), -1) {
		if d[1] == "GO" || d[1] == "STATICCHECK" {
			continue
		}
		require.Contains(t, known, d[1], "Makefile sets %s, which config does not read", d[1])
		m[d[1]] = d[2]
	}
	_, run, ok := strings.Cut(string(b), "\nrun:")
	require.True(t, ok, "no run target")
	run, _, _ = strings.Cut(run, "\n\n")
	serve := regexp.MustCompile(`((?:[A-Z][A-Z0-9_]*=\S+ )+)\./bin/kumiko serve`).FindStringSubmatch(run)
	require.NotNil(t, serve, "make run does not start kumiko serve")
	for _, kv := range strings.Fields(serve[1]) {
		k, v, _ := strings.Cut(kv, "=")
		require.Contains(t, known, k, "make run sets %s, which config does not read", k)
		m[k] = v
	}
	_, err = FromLookup(env(m))
	require.NoError(t, err, "make run's environment is refused")
}

// The postgres image first runs a temporary server for its initialisation
// that listens on the Unix socket only, then restarts. A pg_isready over
// the socket calls that server healthy, releasing the migrate service into
// a refused TCP connection on a fresh volume: the healthcheck must ask over
// TCP, which only the real server answers.
func TestDockerComposePostgresHealthcheckUsesTCP(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../docker-compose.yml")
	require.NoError(t, err)
	var f composeFile
	require.NoError(t, yaml.Unmarshal(b, &f))
	pg, ok := f.Services["postgres"]
	require.True(t, ok, "no postgres service")
	require.NotNil(t, pg.Healthcheck, "postgres: no healthcheck")
	test := pg.Healthcheck.Test
	require.Contains(t, test, "pg_isready", "postgres: the healthcheck runs no pg_isready")
	i := slices.IndexFunc(test, func(a string) bool { return a == "-h" || a == "--host" })
	require.True(t, i >= 0 && i+1 < len(test), "postgres: pg_isready %q asks over the Unix socket; give -h 127.0.0.1", test)
	require.NotNil(t, net.ParseIP(test[i+1]), "postgres: pg_isready -h %q is no TCP address", test[i+1])
}

// make services starts the compose services where a Docker engine runs.
// Docker's proxy accepts on a published port as soon as the container
// runs, before Postgres or Redis answer behind it, so a port probe passes
// at once: make run's migrate then met a database still initialising.
// Compose must wait for the services' healthchecks (--wait).
func TestMakeServicesWaitsForHealthyServices(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../Makefile")
	require.NoError(t, err)
	_, services, ok := strings.Cut(string(b), "\nservices:")
	require.True(t, ok, "no services target")
	services, _, _ = strings.Cut(services, "\n\n")
	ups := regexp.MustCompile(`docker compose up[^;\n]*`).FindAllString(services, -1)
	require.NotEmpty(t, ups, "make services starts no compose services")
	for _, up := range ups {
		require.Contains(t, strings.Fields(up), "--wait", "make services: %q returns before the services are healthy", up)
	}
}

// The load balancer lets every body the API accepts through, and a little
// more: nginx's default client_max_body_size (1 MiB) equals the API's
// limit, so a larger body got nginx's HTML 413 instead of the API's JSON
// payload_too_large.
func TestDockerComposeLoadBalancerLeavesBodyLimitsToTheAPI(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../docker-compose.yml")
	require.NoError(t, err)
	var f composeFile
	require.NoError(t, yaml.Unmarshal(b, &f))
	lb, ok := f.Configs["lb"]
	require.True(t, ok, "no lb config")
	m := regexp.MustCompile(`(?m)^\s*client_max_body_size\s+(\d+)([kKmM]?);`).FindStringSubmatch(lb.Content)
	require.NotNil(t, m, "the lb config sets no client_max_body_size: nginx's default (1m) answers 413 in HTML before the API")
	n, err := strconv.ParseInt(m[1], 10, 64)
	require.NoError(t, err)
	switch strings.ToLower(m[2]) {
	case "k":
		n <<= 10
	case "m":
		n <<= 20
	}
	require.Greater(t, n, web.DefaultBodyLimit, "client_max_body_size must exceed the API's body limit")
}
