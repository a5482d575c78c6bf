/// What `migrate export` did.
public struct ExportReport: Sendable, Equatable {
    /// Lines written by this run (Apple asked, or an id this store already held).
    public var exported = 0
    /// Users the file already held (an earlier run).
    public var alreadyInFile = 0
    /// Apple refused the user (`invalid_request`: consent revoked, or unknown to Apple).
    public var refused: [String] = []
    /// Apple or the store did not answer after retries: run the export again.
    public var failed: [String] = []
    public var appleCalls = 0
}

extension ExportReport {
    /// What the operator reads (no sub of a user who moved: those stay in the store).
    public func summary(file: String) -> [String] {
        var lines = ["exported \(exported) user\(exported == 1 ? "" : "s") to \(file)" + (alreadyInFile > 0 ? " (\(alreadyInFile) already in it from an earlier run)" : "")
                     + "; \(appleCalls) call\(appleCalls == 1 ? "" : "s") to Apple"]
        if !refused.isEmpty {
            lines.append("\(refused.count) refused by Apple (consent revoked or unknown to Apple; they cannot move): " + refused.joined(separator: " "))
        }
        if !failed.isEmpty { lines.append("\(failed.count) not exported (Apple or the store did not answer): run the same command again to finish") }
        lines.append("your own mapping (sub → transfer id) for re-keying your data export: \(TransferMapping.path(beside: file)) (keep it; never give it to the recipient)")
        return lines
    }
}
