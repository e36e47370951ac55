// Package buildinfo names the version of the trainmeter binaries for
// --version, the agent's status and its OTel resource.
package buildinfo

import (
	"runtime/debug"
)

// version is set at link time (go build -ldflags "-X
// github.com/trainmeter/trainmeter/internal/buildinfo.version=1.2.0"; make
// build and make deb do it); empty otherwise.
var version string

// Version is the link-time version, else the module version go install
// recorded, else "dev" with the VCS revision go build recorded
// ("dev+abc123def456", "-dirty" for uncommitted changes), else "dev".
func Version() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	return fromBuildInfo(bi)
}

func fromBuildInfo(bi *debug.BuildInfo) string {
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	v := "dev"
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev != "" {
		v += "+" + rev[:min(12, len(rev))]
		if modified == "true" {
			v += "-dirty"
		}
	}
	return v
}
