package framework

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode"
)

// A field error names its field by the JSON path the client wrote:
// "items[2].sku", "address.zip", "n" for a field promoted from an embedded
// struct. encoding/json names neither slice elements nor map entries, names
// embedded structs by their Go names, and names no field at all for an
// unknown field's object or a value a custom unmarshaler refused; so a
// payload that failed to decode is walked again, value by value, along its
// Go type, and the first value (in document order) that does not decode is
// the one reported.

// jsonField is a field of a struct as encoding/json decodes it.
type jsonField struct {
	name   string       // the JSON name
	tagged bool         // the name comes from a json tag
	index  []int        // the index sequence from the struct
	typ    reflect.Type // the field's Go type
	quoted bool         // the ,string option applies
}

var jsonFieldsCache sync.Map // reflect.Type -> []jsonField

// jsonFields lists the fields encoding/json decodes into the struct type t,
// in index order, by its rules: exported fields and those promoted from
// embedded structs (exported or not) without a json name, not json:"-",
// the shallowest (or only tagged) of equal names winning and equals at one
// depth hiding each other.
func jsonFields(t reflect.Type) []jsonField {
	if f, ok := jsonFieldsCache.Load(t); ok {
		return f.([]jsonField)
	}
	type queued struct {
		typ   reflect.Type
		index []int
	}
	var fields []jsonField
	next := []queued{{typ: t}}
	visited := map[reflect.Type]bool{}
	// nextCount counts the embeddings of each struct queued for the next
	// depth: fields of a struct embedded twice at one depth hide each other.
	var count, nextCount map[reflect.Type]int
	for len(next) > 0 {
		current := next
		next = nil
		count, nextCount = nextCount, map[reflect.Type]int{}
		for _, q := range current {
			if visited[q.typ] {
				continue
			}
			visited[q.typ] = true
			for i := range q.typ.NumField() {
				sf := q.typ.Field(i)
				if sf.Anonymous {
					et := sf.Type
					if et.Kind() == reflect.Pointer {
						et = et.Elem()
					}
					if !sf.IsExported() && et.Kind() != reflect.Struct {
						continue
					}
				} else if !sf.IsExported() {
					continue
				}
				tag := sf.Tag.Get("json")
				if tag == "-" {
					continue
				}
				name, opts, _ := strings.Cut(tag, ",")
				if !isValidJSONTag(name) {
					name = ""
				}
				index := append(slices.Clone(q.index), i)
				ft := sf.Type
				if ft.Name() == "" && ft.Kind() == reflect.Pointer {
					ft = ft.Elem()
				}
				if name != "" || !sf.Anonymous || ft.Kind() != reflect.Struct {
					f := jsonField{name: name, tagged: name != "", index: index, typ: sf.Type}
					if f.name == "" {
						f.name = sf.Name
					}
					if slices.Contains(strings.Split(opts, ","), "string") {
						switch ft.Kind() {
						case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
							reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
							reflect.Float32, reflect.Float64, reflect.String:
							f.quoted = true
						}
					}
					fields = append(fields, f)
					if count[q.typ] > 1 {
						fields = append(fields, f) // annihilated below
					}
					continue
				}
				nextCount[ft]++
				if nextCount[ft] == 1 {
					next = append(next, queued{typ: ft, index: index})
				}
			}
		}
	}
	slices.SortStableFunc(fields, func(a, b jsonField) int {
		if c := strings.Compare(a.name, b.name); c != 0 {
			return c
		}
		if c := len(a.index) - len(b.index); c != 0 {
			return c
		}
		if a.tagged != b.tagged {
			if a.tagged {
				return -1
			}
			return 1
		}
		return slices.Compare(a.index, b.index)
	})
	out := fields[:0]
	for i := 0; i < len(fields); {
		j := i + 1
		for j < len(fields) && fields[j].name == fields[i].name {
			j++
		}
		if j-i == 1 || len(fields[i].index) != len(fields[i+1].index) || fields[i].tagged != fields[i+1].tagged {
			out = append(out, fields[i])
		}
		i = j
	}
	slices.SortFunc(out, func(a, b jsonField) int { return slices.Compare(a.index, b.index) })
	jsonFieldsCache.Store(t, out)
	return out
}

// lookupJSONField finds the field encoding/json decodes key into: the one
// of that exact name, else the first whose name equals it but for case.
func lookupJSONField(fields []jsonField, key string) *jsonField {
	for i := range fields {
		if fields[i].name == key {
			return &fields[i]
		}
	}
	for i := range fields {
		if strings.EqualFold(fields[i].name, key) {
			return &fields[i]
		}
	}
	return nil
}

// isValidJSONTag reports whether encoding/json takes s as a field name.
func isValidJSONTag(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		switch {
		case strings.ContainsRune("!#$%&()*+-./:;<=>?@[]^_{|}~ ", c):
		case !unicode.IsLetter(c) && !unicode.IsDigit(c):
			return false
		}
	}
	return true
}

// appendKey appends an object key to a JSON path: ".key" (just "key" at
// the root), or `["key"]` for a key that is not a plain name.
func appendKey(path, key string) string {
	plain := key != ""
	for _, c := range key {
		if !unicode.IsLetter(c) && !unicode.IsDigit(c) && c != '_' && c != '$' && c != '-' {
			plain = false
			break
		}
	}
	switch {
	case !plain:
		return path + "[" + strconv.Quote(key) + "]"
	case path == "":
		return key
	default:
		return path + "." + key
	}
}

// locateDecodeError finds the first value of raw (in document order) that
// does not decode into a value of type t, as encoding/json with unknown
// fields disallowed decodes it, and describes it as a field error named by
// its JSON path below path; nil if raw decodes (or cannot be walked).
// quoted is the ,string option of the field raw is the value of.
func locateDecodeError(raw []byte, t reflect.Type, quoted bool, path string) *FieldError {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil
	}
	if quoted || isJSONLeaf(t) {
		return leafError(raw, t, quoted, path)
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		if raw[0] != '{' {
			return leafError(raw, t, false, path)
		}
		fields := jsonFields(t)
		return eachMember(raw, func(key string, val []byte) *FieldError {
			f := lookupJSONField(fields, key)
			at := appendKey(path, key)
			if f == nil {
				return &FieldError{Field: at, Rule: "unknown", Message: fmt.Sprintf("unknown field %q", at)}
			}
			if embedsUnexportedPointer(t, f.index) {
				return &FieldError{Field: at, Rule: "json", Message: at + " cannot be decoded from JSON (it is promoted from an embedded pointer to an unexported struct)"}
			}
			return locateDecodeError(val, f.typ, f.quoted, at)
		})
	case reflect.Map:
		if raw[0] != '{' || !decodableMapKey(t.Key()) {
			return leafError(raw, t, false, path)
		}
		return eachMember(raw, func(key string, val []byte) *FieldError {
			if fe := mapKeyError(t.Key(), key, path); fe != nil {
				return fe
			}
			return locateDecodeError(val, t.Elem(), false, appendKey(path, key))
		})
	case reflect.Slice, reflect.Array:
		if raw[0] != '[' {
			return leafError(raw, t, false, path) // a []byte takes base64 text
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		if _, err := dec.Token(); err != nil {
			return nil
		}
		for i := 0; dec.More(); i++ {
			var elem json.RawMessage
			if err := dec.Decode(&elem); err != nil {
				return nil
			}
			if t.Kind() == reflect.Array && i >= t.Len() {
				break // encoding/json drops the elements an array has no room for
			}
			if fe := locateDecodeError(elem, t.Elem(), false, path+"["+strconv.Itoa(i)+"]"); fe != nil {
				return fe
			}
		}
	}
	return nil
}

// eachMember calls fn with each member of the JSON object raw, in order,
// until fn returns a field error.
func eachMember(raw []byte, fn func(key string, val []byte) *FieldError) *FieldError {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil {
		return nil
	}
	for dec.More() {
		tok, err := dec.Token()
		key, ok := tok.(string)
		if err != nil || !ok {
			return nil
		}
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return nil
		}
		if fe := fn(key, val); fe != nil {
			return fe
		}
	}
	return nil
}

// isJSONLeaf reports whether encoding/json decodes a value of type t as a
// whole rather than member by member or element by element: t (or a type
// t points to) decodes itself, or t is no struct, map, slice or array.
func isJSONLeaf(t reflect.Type) bool {
	for {
		if decodesItself(t) {
			return true
		}
		if t.Kind() != reflect.Pointer {
			break
		}
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map, reflect.Slice, reflect.Array:
		return false
	}
	return true
}

// decodesItself reports whether t or *t is a json.Unmarshaler or an
// encoding.TextUnmarshaler.
func decodesItself(t reflect.Type) bool {
	pt := reflect.PointerTo(t)
	return t.Implements(jsonUnmarshalerType) || pt.Implements(jsonUnmarshalerType) ||
		t.Implements(textUnmarshalerType) || pt.Implements(textUnmarshalerType)
}

// decodableMapKey reports whether encoding/json decodes object keys into
// map keys of type kt.
func decodableMapKey(kt reflect.Type) bool {
	switch kt.Kind() {
	case reflect.String, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return true
	}
	return reflect.PointerTo(kt).Implements(textUnmarshalerType)
}

// undecodable reports whether no JSON value but null decodes into type t:
// an interface with methods, a channel, a function, a complex number, a map
// whose keys cannot come from object keys.
func undecodable(t reflect.Type) bool {
	for !decodesItself(t) && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if decodesItself(t) {
		return false
	}
	switch t.Kind() {
	case reflect.Interface:
		return t.NumMethod() > 0
	case reflect.Chan, reflect.Func, reflect.Complex64, reflect.Complex128, reflect.UnsafePointer:
		return true
	case reflect.Map:
		return !decodableMapKey(t.Key())
	}
	return false
}

// embedsUnexportedPointer reports whether the field at index of struct t
// is promoted through an embedded pointer to an unexported struct, which
// encoding/json cannot allocate.
func embedsUnexportedPointer(t reflect.Type, index []int) bool {
	for _, i := range index[:len(index)-1] {
		sf := t.Field(i)
		t = sf.Type
		if t.Kind() == reflect.Pointer {
			if !sf.IsExported() {
				return true
			}
			t = t.Elem()
		}
	}
	return false
}

// mapKeyError describes the object key of the map at path that does not
// decode into a key of type kt, or returns nil.
func mapKeyError(kt reflect.Type, key, path string) *FieldError {
	name := path
	if name == "" {
		name = "payload"
	}
	if reflect.PointerTo(kt).Implements(textUnmarshalerType) {
		quotedKey, _ := json.Marshal(key)
		if err := decodeLeaf(quotedKey, kt, false); err != nil {
			return &FieldError{Field: path, Rule: "json", Message: fmt.Sprintf("%s has a key that is not valid, %q: %s", name, key, strings.TrimPrefix(err.Error(), "json: "))}
		}
		return nil
	}
	var bad bool
	switch kt.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, err := strconv.ParseInt(key, 10, 64)
		bad = err != nil || reflect.Zero(kt).OverflowInt(n)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		n, err := strconv.ParseUint(key, 10, 64)
		bad = err != nil || reflect.Zero(kt).OverflowUint(n)
	}
	if !bad {
		return nil
	}
	msg := fmt.Sprintf("%s keys must be integers, got %q", name, key)
	if _, whole := new(big.Int).SetString(key, 10); whole {
		lo, hi, _ := intRange(kt)
		msg = fmt.Sprintf("%s keys must be integers from %s to %s, got %q", name, lo, hi, key)
	}
	return &FieldError{Field: path, Rule: "type", Param: "integer", Message: msg}
}

// decodeLeaf decodes raw into a new value of type t as encoding/json
// decodes a struct field of type t (with the ,string option if quoted).
func decodeLeaf(raw []byte, t reflect.Type, quoted bool) error {
	tag := `json:"v"`
	if quoted {
		tag = `json:"v,string"`
	}
	wrapper := reflect.StructOf([]reflect.StructField{{Name: "V", Type: t, Tag: reflect.StructTag(tag)}})
	doc := make([]byte, 0, len(raw)+6)
	doc = append(append(append(doc, `{"v":`...), raw...), '}')
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.DisallowUnknownFields()
	return dec.Decode(reflect.New(wrapper).Interface())
}

// leafError decodes raw into a value of type t and describes its failure
// as a field error at path, or returns nil.
func leafError(raw []byte, t reflect.Type, quoted bool, path string) *FieldError {
	err := decodeLeaf(raw, t, quoted)
	if err == nil {
		return nil
	}
	field := path
	var te *json.UnmarshalTypeError
	isType := errors.As(err, &te)
	if isType {
		// A type that decodes itself may name a field of its own.
		if sub := strings.TrimPrefix(strings.TrimPrefix(te.Field, "v"), "."); sub != "" && !quoted {
			if field != "" {
				field += "."
			}
			field += sub
		}
	}
	name := field
	if name == "" {
		name = "payload"
	}
	switch {
	case quoted:
		kind := jsonKind(t)
		article := "a"
		if kind == "integer" {
			article = "an"
		}
		return &FieldError{Field: field, Rule: "type", Param: "string",
			Message: fmt.Sprintf("%s must be of type string holding %s %s, got %s", name, article, kind, rawKind(raw))}
	case isType && undecodable(te.Type):
		return &FieldError{Field: field, Rule: "type", Param: "null",
			Message: fmt.Sprintf("%s cannot be decoded from JSON (it takes only null), got %s", name, rawKind(raw))}
	case isType:
		return typeFieldError(field, te)
	}
	return &FieldError{Field: field, Rule: "json", Message: fmt.Sprintf("%s is not valid: %s", name, strings.TrimPrefix(err.Error(), "json: "))}
}

// typeFieldError describes a value of the wrong JSON kind for field by the
// kind the field takes (and an integer out of range by the range).
func typeFieldError(field string, te *json.UnmarshalTypeError) *FieldError {
	name := field
	if name == "" {
		name = "payload" // the payload itself has the wrong kind
	}
	kind := jsonKind(te.Type)
	msg := fmt.Sprintf("%s must be of type %s, got %s", name, kind, te.Value)
	if lo, hi, ok := intRange(te.Type); ok {
		// A whole number out of the field's range (the decoder says
		// only "number 300"): name the range.
		if n, isNum := strings.CutPrefix(te.Value, "number "); isNum {
			if _, ok := new(big.Int).SetString(n, 10); ok {
				msg = fmt.Sprintf("%s must be an integer from %s to %s, got %s", name, lo, hi, n)
			}
		}
	}
	return &FieldError{Field: field, Rule: "type", Param: kind, Message: msg}
}

// rawKind names the JSON kind of the value raw as encoding/json's type
// errors do.
func rawKind(raw []byte) string {
	switch raw[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "bool"
	case 'n':
		return "null"
	}
	return "number"
}

// DecodeErrorPath returns the JSON path ("items[2].sku", "address.zip") of
// the first value of raw, in document order, that does not decode into v's
// type as encoding/json decodes it with unknown fields disallowed (for an
// unknown field, the field's own path): encoding/json's errors name the
// Go path, without indexes. It returns "" when raw decodes, cannot be
// walked (malformed JSON), the failing value is raw itself, or raw is
// larger than the 64 KiB the walk is bounded to.
func DecodeErrorPath(raw []byte, v any) string {
	t := reflect.TypeOf(v)
	if t == nil || len(raw) > maxLocatedPayload {
		return ""
	}
	if fe := locateDecodeError(raw, t, false, ""); fe != nil {
		return fe.Field
	}
	return ""
}
