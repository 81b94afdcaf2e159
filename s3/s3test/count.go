package s3test

import (
	"context"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
)

// Writes returns how many times the object key in the server's bucket was
// written: 0 if never, 1 if once, more after overwrites. On an in-process
// server it is the server's own count of the writes it answered with 200;
// on versitygw or an external endpoint it is the number of the key's
// object versions (delete markers excluded). A conformance harness's Count
// is this call.
func (s *Server) Writes(ctx context.Context, key string) (int, error) {
	m, err := s.writes(ctx, key, false)
	return m[key], err
}

// WritesUnder returns the writes of every object whose key starts with
// prefix, by key, counted as [Server.Writes] counts them. Summing it gives
// a harness's Total; an entry above 1 is an overwrite.
func (s *Server) WritesUnder(ctx context.Context, prefix string) (map[string]int, error) {
	return s.writes(ctx, prefix, true)
}

func (s *Server) writes(ctx context.Context, key string, byPrefix bool) (map[string]int, error) {
	if s.mem != nil {
		return s.mem.writesOf(s.Bucket, key, byPrefix), nil
	}
	c, closeFn := s.NewClient()
	defer closeFn()
	return versions(ctx, c, s.Bucket, key, byPrefix)
}

// versions counts the object versions in a versioned bucket (delete markers
// excluded), by key, of the object named key, or (byPrefix) of every object
// whose key starts with key. In a versioned bucket every successful write
// of a key is a version, so this counts writes, overwrites included. It
// counts distinct (key, version id) pairs: versitygw v1.8.0 repeats the
// last version of a truncated page at the top of the next one (its key
// and version-id markers are inclusive), which a plain count would take for
// an extra write.
func versions(ctx context.Context, client *awss3.Client, bucket, key string, byPrefix bool) (map[string]int, error) {
	type version struct{ key, id string }
	seen := map[version]bool{}
	out := map[string]int{}
	p := awss3.NewListObjectVersionsPaginator(client, &awss3.ListObjectVersionsInput{Bucket: aws.String(bucket), Prefix: aws.String(key)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("s3test: listing versions under %q in %s: %w", key, bucket, err)
		}
		for _, v := range page.Versions {
			k := aws.ToString(v.Key)
			if !byPrefix && k != key || byPrefix && !strings.HasPrefix(k, key) {
				continue
			}
			if id := (version{k, aws.ToString(v.VersionId)}); !seen[id] {
				seen[id] = true
				out[k]++
			}
		}
	}
	return out, nil
}
