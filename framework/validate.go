package framework

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"

	"github.com/go-playground/validator/v10"
)

var (
	validateOnce sync.Once
	validate     *validator.Validate
)

// payloadValidator returns the shared validator, reporting JSON field names.
func payloadValidator() *validator.Validate {
	validateOnce.Do(func() {
		validate = validator.New(validator.WithRequiredStructEnabled())
		validate.RegisterTagNameFunc(func(f reflect.StructField) string {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" {
				return ""
			}
			if name == "" {
				return f.Name
			}
			return name
		})
	})
	return validate
}

// ValidatePayload checks v's validator tags and returns a *[ValidationError]
// listing every failed field, or nil. Non-struct values pass.
func ValidatePayload(v any) error {
	rv := reflect.ValueOf(v)
	for rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			return nil
		}
		rv = rv.Elem()
	}
	if rv.Kind() != reflect.Struct {
		return nil
	}
	err := payloadValidator().Struct(v)
	if err == nil {
		return nil
	}
	var verrs validator.ValidationErrors
	if !errors.As(err, &verrs) {
		return &ValidationError{Fields: []FieldError{{Field: "", Rule: "invalid", Message: err.Error()}}}
	}
	out := &ValidationError{}
	for _, fe := range verrs {
		field := fe.Namespace()
		if _, rest, ok := strings.Cut(field, "."); ok {
			field = rest // drop the struct's own name
		}
		out.Fields = append(out.Fields, FieldError{Field: field, Rule: fe.Tag(), Param: fe.Param(), Message: fieldMessage(field, fe)})
	}
	return out
}

func fieldMessage(field string, fe validator.FieldError) string {
	switch fe.Tag() {
	case "required":
		return field + " is required"
	case "max":
		if fe.Kind() == reflect.String {
			return fmt.Sprintf("%s must be at most %s characters", field, fe.Param())
		}
		return fmt.Sprintf("%s must be at most %s", field, fe.Param())
	case "min":
		if fe.Kind() == reflect.String {
			return fmt.Sprintf("%s must be at least %s characters", field, fe.Param())
		}
		return fmt.Sprintf("%s must be at least %s", field, fe.Param())
	case "gte":
		return fmt.Sprintf("%s must be >= %s", field, fe.Param())
	case "lte":
		return fmt.Sprintf("%s must be <= %s", field, fe.Param())
	case "email":
		return field + " must be an email address"
	case "uuid", "uuid4", "uuid7":
		return field + " must be a UUID"
	case "oneof":
		return fmt.Sprintf("%s must be one of [%s]", field, fe.Param())
	default:
		return fmt.Sprintf("%s fails rule %q", field, fe.Tag()+map[bool]string{true: "=" + fe.Param(), false: ""}[fe.Param() != ""])
	}
}
