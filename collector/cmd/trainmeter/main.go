// Command trainmeter is the trainmeter collector (`trainmeter serve`) and
// the CLI that reads from it (`runs`, `report`, `export csv`, `nodes`).
package main

import (
	"os"

	"github.com/trainmeter/trainmeter/collector/internal/cli"
)

func main() { os.Exit(cli.Main()) }
