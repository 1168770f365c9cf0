// modzip writes a module version in the GOPROXY layout (the module proxy protocol:
// $OUT/<module path>/@v/list, <version>.info, <version>.mod and <version>.zip) from the
// module's directory. The zip is made by golang.org/x/mod/zip, the code the go command
// itself uses, so it holds exactly what `go mod download` would get from the tag (no nested
// modules, vendor directories or version control files) and passes the same checks. A
// GOPROXY=file://$OUT consumer then depends on exactly that zip, not on the source tree.
//
// It is a module of its own (release/go.mod), so that the client's module does not require
// golang.org/x/mod, and so that it is not part of the client's zip.
//
//	go run . DIR MODULE VERSION OUT   (from this directory)
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

func main() {
	if len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: go run . DIR MODULE VERSION OUT")
		os.Exit(2)
	}
	if err := write(os.Args[1], os.Args[2], os.Args[3], os.Args[4]); err != nil {
		fmt.Fprintln(os.Stderr, "modzip:", err)
		os.Exit(1)
	}
}

func write(dir, path, version, out string) error {
	release := module.Version{Path: path, Version: version}
	if err := module.Check(path, version); err != nil {
		return err
	}
	escaped, err := module.EscapePath(path)
	if err != nil {
		return err
	}
	at := filepath.Join(out, filepath.FromSlash(escaped), "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		return err
	}
	mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	info, err := json.Marshal(map[string]string{"Version": version, "Time": time.Now().UTC().Format(time.RFC3339)})
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{"list": []byte(version + "\n"), version + ".info": info, version + ".mod": mod} {
		if err := os.WriteFile(filepath.Join(at, name), data, 0o644); err != nil {
			return err
		}
	}
	file, err := os.Create(filepath.Join(at, version+".zip"))
	if err != nil {
		return err
	}
	if err := modzip.CreateFromDir(file, release, dir); err != nil {
		file.Close()
		return err
	}
	return file.Close()
}
