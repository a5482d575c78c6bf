import NIOCore
import NIOHPACK
import NIOHTTP1

/// Responses for an HTTP/2 client: the header blocks (and body) the stream writes, made by the
/// rules HTTP/1.1 responses follow (`ResponseHead.relays`, `HTTPWire.localResponse`), so that
/// what a client is shown does not depend on the protocol it speaks.
///
/// HTTP/2 differences (RFC 9113 §8.2, §8.3.2): `:status` comes first; names are lower case;
/// connection-specific fields never appear (the HTTP/1 rules already drop them); there is no
/// `Connection: close` (a connection is closed with GOAWAY, not by a response).
enum HTTP2ResponseHeaders {
    /// The HEADERS of an upstream's final (2xx–5xx) response relayed to the client: the app's
    /// fields the HTTP/1.1 relay keeps, in order, then `x-request-id` when the app set none.
    static func relayed(_ response: ResponseHead, rules: RequestHeaderRules?, requestID: String?) -> HPACKHeaders {
        let head = response.head
        var headers = HPACKHeaders()
        headers.reserveCapacity(head.fields.count + 2)
        headers.add(name: ":status", value: String(head.status))
        let named = response.connectionNamed
        for field in head.fields where response.relays(field, named: named, rules: rules) {
            headers.add(name: head.name(field).lowercased(), value: head.value(field))
        }
        if !response.hasRequestID, let requestID { headers.add(name: "x-request-id", value: requestID) }
        return headers
    }

    /// A response the gateway answers itself, as HEADERS and the DATA to send (nil: none, the
    /// HEADERS end the stream). Headers as `HTTPWire.localResponse` writes them: unsafe values
    /// dropped, `x-request-id`, `content-length`; connection-specific ones are never sent, and
    /// `close` has no meaning for one stream (the caller decides about the connection).
    static func local(_ response: LocalResponse, requestID: String?, headRequest: Bool) -> (headers: HPACKHeaders, body: ByteBuffer?) {
        var headers = HPACKHeaders()
        headers.reserveCapacity(response.headers.count + 3)
        headers.add(name: ":status", value: String(response.status.code))
        for (name, value) in response.headers where HTTPWire.isSafeValue(value) && HTTPWire.isSafeValue(name) {
            let lower = name.lowercased()
            if Self.connectionSpecific.contains(lower) || lower == "content-length" { continue }
            headers.add(name: lower, value: value)
        }
        if let requestID { headers.add(name: "x-request-id", value: requestID) }
        headers.add(name: "content-length", value: String(response.body.readableBytes))
        let body = headRequest || response.body.readableBytes == 0 ? nil : response.body
        return (headers, body)
    }

    /// Fields HTTP/2 forbids in any message (RFC 9113 §8.2.2).
    static let connectionSpecific: Set<String> = ["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te"]
}
