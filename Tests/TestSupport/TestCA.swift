import Foundation

/// A certificate authority made with `openssl` for one test: a CA certificate, and leaf
/// certificates (server or client) it signs, valid for any dates — an expired one included.
/// Everything lives in a temporary directory, removed by `remove()`.
public final class TestCA: @unchecked Sendable {
    public let directory: String
    public var certificateFile: String { directory + "/ca.pem" }
    private var serial = 0

    public init(name: String = "SessionGate Test CA") throws {
        directory = NSTemporaryDirectory() + "sessiongate-ca-\(UInt64.random(in: 0 ... .max))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try "".write(toFile: directory + "/index.txt", atomically: true, encoding: .utf8)
        try """
            [ca]
            default_ca = test
            [test]
            database = \(directory)/index.txt
            serial = \(directory)/serial
            new_certs_dir = \(directory)
            default_md = sha256
            policy = anything
            copy_extensions = copy
            unique_subject = no
            [anything]
            commonName = supplied
            """.write(toFile: directory + "/ca.cnf", atomically: true, encoding: .utf8)
        try Self.openssl(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", directory + "/ca.key",
                          "-out", certificateFile, "-days", "30", "-subj", "/CN=\(name)"])
    }

    public struct Leaf: Sendable {
        public let certificateFile: String
        public let privateKeyFile: String
    }

    /// A leaf certificate for `dnsNames` and `ipAddresses`, valid from `notBefore` for `days`
    /// (negative `daysAgo` moves both dates into the past).
    public func issue(_ commonName: String, dnsNames: [String] = ["localhost"], ipAddresses: [String] = ["127.0.0.1"],
                      validFor days: Int = 30, startingDaysAgo daysAgo: Int = 1) throws -> Leaf {
        serial += 1
        let base = directory + "/\(commonName)-\(serial)"
        let names = dnsNames.map { "DNS:\($0)" } + ipAddresses.map { "IP:\($0)" }
        var request = ["req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", base + ".key",
                       "-out", base + ".csr", "-subj", "/CN=\(commonName)"]
        if !names.isEmpty { request += ["-addext", "subjectAltName=" + names.joined(separator: ",")] }
        try Self.openssl(request)
        let start = Date().addingTimeInterval(-Double(daysAgo) * 86_400)
        let end = start.addingTimeInterval(Double(days) * 86_400)
        try Self.openssl(["ca", "-batch", "-notext", "-config", directory + "/ca.cnf", "-cert", certificateFile, "-keyfile", directory + "/ca.key",
                          "-in", base + ".csr", "-out", base + ".pem", "-startdate", Self.stamp(start), "-enddate", Self.stamp(end),
                          "-create_serial"])
        return Leaf(certificateFile: base + ".pem", privateKeyFile: base + ".key")
    }

    public func remove() { try? FileManager.default.removeItem(atPath: directory) }

    /// `YYYYMMDDHHMMSSZ`, as `openssl ca` takes dates.
    private static func stamp(_ date: Date) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.dateFormat = "yyyyMMddHHmmss'Z'"
        return formatter.string(from: date)
    }

    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    @discardableResult
    public static func openssl(_ arguments: [String]) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
        process.arguments = arguments
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        let text = String(decoding: data, as: UTF8.self)
        guard process.terminationStatus == 0 else { throw Failure(description: "openssl \(arguments.first ?? ""): \(text)") }
        return text
    }
}
