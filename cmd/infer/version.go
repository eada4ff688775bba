package main

import (
	"fmt"
	"runtime/debug"

	"github.com/fuselm/fuselm/report"
)

// version and commit name the build. scripts/gpu_build.sh sets them with
// -ldflags "-X main.version=... -X main.commit=..."; where it is not set,
// buildVersion falls back on what the Go toolchain stamped into the binary
// (the module's version under go install, the VCS revision under go build
// in a checkout), and go run, which stamps neither, leaves the commit
// unknown.
var (
	version = ""
	commit  = ""
)

// buildVersion is the build's version ("devel" when nothing names one) and
// its commit ("" when unknown; "+dirty" marks uncommitted changes).
func buildVersion() (ver, rev string) {
	ver, rev = version, commit
	info, ok := debug.ReadBuildInfo()
	if ok && ver == "" && info.Main.Version != "" && info.Main.Version != "(devel)" {
		ver = info.Main.Version
	}
	if ver == "" {
		ver = "devel"
	}
	if ok && rev == "" {
		dirty := false
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if rev != "" && dirty {
			rev += "+dirty"
		}
	}
	return ver, rev
}

// versionLine is what infer --version prints.
func versionLine() string {
	ver, rev := buildVersion()
	if rev == "" {
		rev = "unknown (go run stamps none; go build in a git checkout or scripts/gpu_build.sh does)"
	}
	return fmt.Sprintf("infer (fuselm) %s, commit %s", ver, rev)
}

// newProvenance is the provenance of a document made now on device ("" for
// none), by this build.
func newProvenance(device string) report.Provenance {
	ver, rev := buildVersion()
	return report.NewProvenance(ver, rev, device)
}
