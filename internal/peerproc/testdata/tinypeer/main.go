// SPDX-License-Identifier: Apache-2.0

// Command tinypeer is the smallest peer SharedBuilds' tests build: it links in a second.
package main

func main() {}
