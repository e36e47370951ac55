package agent

import "github.com/trainmeter/trainmeter/agent/internal/agentconfig"

// Config is the agent's configuration; it lives in package agentconfig so
// that what only reads it (doctor, the flag and file loading) does not
// import the agent's wiring.
type Config = agentconfig.Config
