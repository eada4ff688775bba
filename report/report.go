// Package report holds the documents infer writes: their JSON form, which
// every one opens with its provenance, and the text each prints.
package report

import (
	"encoding/json"
	"time"

	"github.com/fuselm/fuselm/kernels/profile"
)

// Provenance opens every JSON document infer writes: the build that made
// it, when (UTC, RFC 3339) and on which device (null where none ran: a dry
// run for --arch).
type Provenance struct {
	Version string  `json:"version"`
	Commit  *string `json:"commit"` // null when the build does not know it
	Date    string  `json:"date"`
	Device  *string `json:"device"`
}

// NewProvenance is the provenance of a document made now on device ("" for
// none) by the build of version ver and commit rev ("" when unknown).
func NewProvenance(ver, rev, device string) Provenance {
	return Provenance{Version: ver, Commit: profile.NonZero(rev), Date: time.Now().UTC().Format(time.RFC3339), Device: profile.NonZero(device)}
}

// JSON is v as one indented JSON document, ending in a newline.
func JSON(v any) ([]byte, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
