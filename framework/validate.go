package framework

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
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
		field, state := payloadPath(rv.Type(), fe.StructNamespace())
		switch state {
		case pathIgnored:
			continue // a field the payload cannot set: its tags are not the client's to meet
		case pathUnparsed:
			field = fe.Namespace()
			if _, rest, ok := strings.Cut(field, "."); ok {
				field = rest // drop the struct's own name
			}
		}
		out.Fields = append(out.Fields, FieldError{Field: field, Rule: fe.Tag(), Param: fe.Param(), Message: fieldMessage(field, fe)})
	}
	if len(out.Fields) == 0 {
		return nil
	}
	return out
}

// pathState says what [payloadPath] made of a validator namespace.
type pathState int

const (
	pathFound    pathState = iota // the namespace names a field of the payload
	pathIgnored                   // it runs through a field encoding/json does not decode (json:"-", hidden)
	pathUnparsed                  // it does not follow the type
)

// payloadPath turns the Go namespace of a failed field of a value of the
// struct type root, as the validator reports it ("PlaceInput.Items[2].SKU",
// "PlaceInput.Inner.N" for a field promoted from an embedded struct), into
// the field's JSON path ("items[2].sku", "n").
func payloadPath(root reflect.Type, ns string) (string, pathState) {
	if name := root.Name(); name != "" {
		// The validator heads the namespace with the struct's name, when
		// it has one.
		rest, ok := strings.CutPrefix(ns, name+".")
		if !ok {
			return "", pathUnparsed
		}
		ns = rest
	}
	return jsonPathOf(root, "."+ns, "", nil, nil)
}

// jsonPathOf appends to path the JSON path of the rest ns of a validator
// namespace into a value of type t. owner is the struct whose JSON fields
// a promoted field is one of, chain its index from there.
func jsonPathOf(t reflect.Type, ns, path string, owner reflect.Type, chain []int) (string, pathState) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if ns == "" {
		return path, pathFound
	}
	switch t.Kind() {
	case reflect.Struct:
		rest, ok := strings.CutPrefix(ns, ".")
		if !ok {
			return "", pathUnparsed
		}
		end := strings.IndexAny(rest, ".[")
		if end < 0 {
			end = len(rest)
		}
		sf, ok := t.FieldByName(rest[:end])
		if !ok || len(sf.Index) != 1 {
			return "", pathUnparsed
		}
		rest = rest[end:]
		if owner == nil {
			owner, chain = t, nil
		}
		chain = append(slices.Clone(chain), sf.Index[0])
		tag := sf.Tag.Get("json")
		if tag == "-" {
			return "", pathIgnored
		}
		name, _, _ := strings.Cut(tag, ",")
		if !isValidJSONTag(name) {
			name = ""
		}
		ft := sf.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if sf.Anonymous && name == "" && ft.Kind() == reflect.Struct {
			// Promoted: its fields are the owner's.
			return jsonPathOf(ft, rest, path, owner, chain)
		}
		if name == "" {
			name = sf.Name
		}
		f := lookupJSONField(jsonFields(owner), name)
		if f == nil || !slices.Equal(f.index, chain) {
			return "", pathIgnored // unexported, or hidden by another field of its name
		}
		return jsonPathOf(sf.Type, rest, appendKey(path, name), nil, nil)
	case reflect.Slice, reflect.Array:
		end := strings.IndexByte(ns, ']')
		if !strings.HasPrefix(ns, "[") || end < 0 {
			return "", pathUnparsed
		}
		return jsonPathOf(t.Elem(), ns[end+1:], path+ns[:end+1], nil, nil)
	case reflect.Map:
		if !strings.HasPrefix(ns, "[") {
			return "", pathUnparsed
		}
		// The key is printed as is: it ends at the first "]" after which
		// the rest follows the element type.
		for end := 1; end < len(ns); end++ {
			if ns[end] != ']' {
				continue
			}
			if p, state := jsonPathOf(t.Elem(), ns[end+1:], appendKey(path, ns[1:end]), nil, nil); state != pathUnparsed {
				return p, state
			}
		}
		return "", pathUnparsed
	}
	// A value behind an interface: its shape is not the type's.
	if path == "" {
		ns = strings.TrimPrefix(ns, ".")
	}
	return path + ns, pathFound
}

func fieldMessage(field string, fe validator.FieldError) string {
	if field == "" {
		field = "payload" // a tag on a struct embedded in the payload's own
	}
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
