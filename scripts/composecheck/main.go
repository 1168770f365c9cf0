// composecheck loads a compose file as `docker compose config` does (compose-go, the library
// Docker Compose itself parses with): the compose-spec JSON schema, interpolation, env files,
// extends and anchors, the references between services, volumes and networks. It prints the
// resolved project and exits non-zero on any error.
//
//	composecheck deploy/compose.yaml
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/compose-spec/compose-go/v2/cli"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: composecheck COMPOSE_FILE")
		os.Exit(2)
	}
	options, err := cli.NewProjectOptions([]string{os.Args[1]},
		cli.WithOsEnv, cli.WithDotEnv, cli.WithConfigFileEnv, cli.WithDefaultProfiles())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	project, err := options.LoadProject(context.Background())
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	resolved, err := project.MarshalYAML()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Stdout.Write(resolved)
	fmt.Fprintf(os.Stderr, "%s: valid (compose-spec, as Docker Compose loads it): %d services\n", os.Args[1], len(project.Services))
}
