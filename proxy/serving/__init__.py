"""One model request, whichever way it comes (a model's HTTP route, a WebSocket, a batch's line, a peer): what it
asks for, whose key sent it and what that key may do, its quotas, how it is held and how it ends, its errors."""
