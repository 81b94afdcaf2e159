package s3

import (
	"reflect"
	"testing"

	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// Every field a hook may set reaches CreateMultipartUpload: createInput
// copies it, with the same type, so one hook covers both paths.
func TestCreateInputCopiesEveryHookableField(t *testing.T) {
	in := &awss3.PutObjectInput{}
	iv := reflect.ValueOf(in).Elem()
	for name := range hookable {
		f := iv.FieldByName(name)
		if !f.IsValid() {
			t.Fatalf("hookable field %s is not in PutObjectInput", name)
		}
		switch f.Kind() {
		case reflect.Pointer:
			f.Set(reflect.New(f.Type().Elem()))
		case reflect.String:
			f.SetString("set-by-hook")
		default:
			t.Fatalf("field %s: kind %s not covered by this test", name, f.Kind())
		}
	}
	c := reflect.ValueOf(createInput(in)).Elem()
	for name := range hookable {
		got := c.FieldByName(name)
		if !got.IsValid() {
			t.Errorf("hookable field %s is not in CreateMultipartUploadInput", name)
			continue
		}
		if !reflect.DeepEqual(got.Interface(), iv.FieldByName(name).Interface()) {
			t.Errorf("createInput did not copy %s", name)
		}
	}
}

// Each PutObjectInput field is either one a hook may set or one the
// adapter owns with a reason; a field added by a newer SDK shows up here
// (until then a hook that sets it is refused as unknown).
func TestEveryPutObjectFieldIsClassified(t *testing.T) {
	typ := reflect.TypeFor[awss3.PutObjectInput]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		if !f.IsExported() || hookable[f.Name] || protected[f.Name] != "" || isChecksumValue(f.Name) {
			continue
		}
		t.Errorf("PutObjectInput.%s is neither hookable nor protected", f.Name)
	}
	for name := range protected {
		if _, ok := typ.FieldByName(name); !ok {
			t.Errorf("protected field %s is not in PutObjectInput", name)
		}
	}
}

// Every checksum algorithm has the part checksum field completedPart copies.
func TestCompletedPartCarriesEveryAlgorithm(t *testing.T) {
	for _, alg := range types.ChecksumAlgorithm("").Values() {
		out := &awss3.UploadPartOutput{}
		f := reflect.ValueOf(out).Elem().FieldByName("Checksum" + string(alg))
		if !f.IsValid() {
			t.Errorf("UploadPartOutput has no Checksum%s", alg)
			continue
		}
		v := "sum-" + string(alg)
		f.Set(reflect.ValueOf(&v))
		cp := completedPart(1, out, alg)
		got := reflect.ValueOf(cp).FieldByName("Checksum" + string(alg))
		if !got.IsValid() || got.IsNil() || got.Elem().String() != v {
			t.Errorf("completedPart(%s) did not carry the part's checksum", alg)
		}
	}
}
