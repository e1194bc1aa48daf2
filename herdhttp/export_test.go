package herdhttp

// NewProxyOver is NewProxy over a transport the test gives.
var NewProxyOver = newProxy
