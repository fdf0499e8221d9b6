package cli

import (
	"errors"
	"strconv"

	"github.com/spf13/pflag"
)

// decimalInt is an integer flag read in base 10 only. pflag's IntVar and
// Int64Var read Go's base prefixes: `--older-than-days 030` (a zero-padded
// number from a script) was octal 24, `08` failed and `0x10` was 16. A
// leading zero is read as the decimal number it pads.
type decimalInt[T int | int64] struct{ p *T }

// intFlag defines the decimal int flag name on fs, like fs.IntVar.
func intFlag[T int | int64](fs *pflag.FlagSet, p *T, name string, value T, usage string) {
	*p = value
	fs.Var(decimalInt[T]{p}, name, usage)
}

// String returns the value in base 10.
func (d decimalInt[T]) String() string { return strconv.FormatInt(int64(*d.p), 10) }

// Set parses s in base 10 into the flag's variable.
func (d decimalInt[T]) Set(s string) error {
	v, err := strconv.ParseInt(s, 10, 64)
	if err == nil && int64(T(v)) != v {
		err = strconv.ErrRange
	}
	if errors.Is(err, strconv.ErrRange) {
		return errors.New("out of range")
	}
	if err != nil {
		return errors.New("not a decimal integer")
	}
	*d.p = T(v)
	return nil
}

// Type names the flag's type in the help, as pflag's own integer flags.
func (d decimalInt[T]) Type() string {
	var zero T
	if _, ok := any(zero).(int64); ok {
		return "int64"
	}
	return "int"
}

// dayCount writes n days for a message: "1 day", "30 days".
func dayCount(n int) string {
	if n == 1 {
		return "1 day"
	}
	return strconv.Itoa(n) + " days"
}
