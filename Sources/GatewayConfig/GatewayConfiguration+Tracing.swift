import Yams

extension GatewayConfiguration.Tracing {
    enum Key: String, ConfigKey {
        case endpoint, `protocol`, sampleRatio = "sample_ratio", headers, includeUser = "include_user", serviceName = "service_name"
        case timeout, maxQueue = "max_queue"
    }

    /// Reads `tracing`: where spans go and how, how many traces are recorded.
    mutating func read(_ s: ConfigReader.Section<Key>, _ r: ConfigReader) {
        if let v = r.enumeration(s, .protocol, as: ExportProtocol.self) { exportProtocol = v }
        if exportProtocol == .grpc { endpoint = "http://127.0.0.1:4317" }
        if let v = r.string(s, .endpoint) {
            if GatewayConfiguration.isWebURL(v) {
                endpoint = v
            } else {
                r.report(s, .endpoint, "'\(v)' is not an http:// or https:// URL with a host")
            }
        }
        if let text = r.string(s, .sampleRatio) {
            if let v = Double(text), v >= 0, v <= 1 {
                sampleRatio = v
            } else {
                r.report(s, .sampleRatio, "'\(text)' is not a number from 0 to 1 (the share of new traces recorded)")
            }
        }
        if let node = s[.headers] {
            readHeaders(node, path: s.child(.headers), r)
        }
        if let v = r.bool(s, .includeUser) { includeUser = v }
        if let v = r.string(s, .serviceName) {
            if v.isEmpty { r.report(s, .serviceName, "must not be empty") } else { serviceName = v }
        }
        if let v = r.duration(s, .timeout, atLeast: .milliseconds(100)) { timeout = v }
        if let v = r.int(s, .maxQueue, range: 64...1_000_000) { maxQueue = v }
    }

    /// `headers`: a mapping of field names (tokens) to values without control characters.
    private mutating func readHeaders(_ node: Node, path: String, _ r: ConfigReader) {
        guard case .mapping(let mapping) = node else {
            r.report(path, node.mark, "expected a mapping of header names to values")
            return
        }
        for (keyNode, valueNode) in mapping {
            guard let name = keyNode.scalar?.string, !name.isEmpty, name.utf8.allSatisfy(Self.isTokenByte) else {
                r.report(path, keyNode.mark, "'\(keyNode.scalar?.string ?? "?")' is not a header name")
                continue
            }
            guard let value = valueNode.scalar?.string, value.utf8.allSatisfy({ $0 == 0x09 || ($0 >= 0x20 && $0 != 0x7f) }) else {
                r.report("\(path).\(name)", valueNode.mark, "expected a header value (text without control characters)")
                continue
            }
            headers[name.lowercased()] = value
        }
    }

    private static func isTokenByte(_ b: UInt8) -> Bool {
        switch b {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"): return true
        default: return "!#$%&'*+-.^_`|~".utf8.contains(b)
        }
    }
}
