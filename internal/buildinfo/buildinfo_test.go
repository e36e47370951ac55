package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	for _, c := range []struct {
		bi   debug.BuildInfo
		want string
	}{
		{debug.BuildInfo{Main: debug.Module{Version: "v1.2.0"}}, "v1.2.0"},
		{debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "dev"},
		{debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "50980b4d2f3a9c1e0b7a6d5c4e3f2a1b0c9d8e7f"}, {Key: "vcs.modified", Value: "true"}}}, "dev+50980b4d2f3a-dirty"},
		{debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}}}, "dev+abc"},
	} {
		if got := fromBuildInfo(&c.bi); got != c.want {
			t.Errorf("%+v: got %q, want %q", c.bi, got, c.want)
		}
	}
}
