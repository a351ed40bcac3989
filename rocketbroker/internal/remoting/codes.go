// Package remoting is RocketMQ 4.x's remoting wire format, written for
// idem from the protocol's definitions (the Java broker's RequestCode,
// ResponseCode, RemotingCommand and MessageDecoder, and what the Go client
// sends): length-prefixed frames with a JSON or ROCKETMQ-serialised header
// (code, opaque, flag, remark, ext fields) and a body; the message
// properties string; the store format of pulled messages and the batch
// format of sent ones. The fake broker (internal/fakerocket) and the
// adapter's lag queries use it. Decoders never panic on malformed input
// (fuzzed) and reject what does not add up.
package remoting

import (
	"errors"
	"fmt"
	"time"
)

// Request codes (org.apache.rocketmq.common.protocol.RequestCode).
const (
	SendMessage              = 10
	PullMessage              = 11
	QueryConsumerOffset      = 14
	UpdateConsumerOffset     = 15
	UpdateAndCreateTopic     = 17
	SearchOffsetByTimestamp  = 29
	GetMaxOffset             = 30
	GetMinOffset             = 31
	HeartBeat                = 34
	UnregisterClient         = 35
	ConsumerSendMsgBack      = 36
	GetConsumerListByGroup   = 38
	NotifyConsumerIdsChanged = 40
	LockBatchMQ              = 41
	UnlockBatchMQ            = 42
	GetRouteInfoByTopic      = 105
	DeleteTopicInBroker      = 215
	DeleteTopicInNamesrv     = 216
	SendMessageV2            = 310
	SendBatchMessage         = 320
)

// Response codes (ResponseCode, RemotingSysResponseCode).
const (
	Success                 = 0
	SystemError             = 1
	SystemBusy              = 2
	RequestCodeNotSupported = 3
	FlushDiskTimeout        = 10
	SlaveNotAvailable       = 11
	FlushSlaveTimeout       = 12
	MessageIllegal          = 13
	ServiceNotAvailable     = 14
	NoPermission            = 16
	TopicNotExist           = 17
	PullNotFound            = 19
	PullRetryImmediately    = 20
	PullOffsetMoved         = 21
	QueryNotFound           = 22
)

// Well-known property names (MessageConst).
const (
	PropertyKeys              = "KEYS"
	PropertyTags              = "TAGS"
	PropertyDelayLevel        = "DELAY"
	PropertyRetryTopic        = "RETRY_TOPIC"
	PropertyRealTopic         = "REAL_TOPIC"
	PropertyRealQueueID       = "REAL_QID"
	PropertyOriginMessageID   = "ORIGIN_MESSAGE_ID"
	PropertyUniqueKey         = "UNIQ_KEY"
	PropertyCluster           = "CLUSTER"
	PropertyWaitStoreMsgOK    = "WAIT"
	PropertyTransactionPrep   = "TRAN_MSG"
	PropertyMaxReconsumeTimes = "MAX_RECONSUME_TIMES"
)

// Topic prefixes (MixAll).
const (
	RetryTopicPrefix = "%RETRY%"
	DLQTopicPrefix   = "%DLQ%"
)

// RetryTopic and DLQTopic are a consumer group's retry and dead-letter
// topics.
func RetryTopic(group string) string { return RetryTopicPrefix + group }
func DLQTopic(group string) string   { return DLQTopicPrefix + group }

// Permission bits of a topic's queues (PermName).
const (
	PermInherit = 1
	PermWrite   = 2
	PermRead    = 4
)

// DefaultDelayLevels are a broker's default messageDelayLevel ("1s 5s 10s
// 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"): level i+1 waits
// DefaultDelayLevels[i].
var DefaultDelayLevels = []time.Duration{
	time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second,
	time.Minute, 2 * time.Minute, 3 * time.Minute, 4 * time.Minute, 5 * time.Minute,
	6 * time.Minute, 7 * time.Minute, 8 * time.Minute, 9 * time.Minute, 10 * time.Minute,
	20 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour,
}

// CheckName applies the broker's rules for topic (and group) names:
// 1 to 127 bytes of [%|a-zA-Z0-9_-].
func CheckName(name string) error {
	if name == "" {
		return errors.New("the name is blank")
	}
	if len(name) > 127 {
		return fmt.Errorf("%q is longer than 127 bytes", name)
	}
	return CheckChars(name)
}

// CheckChars reports a name with a character outside [%|a-zA-Z0-9_-].
func CheckChars(name string) error {
	for _, r := range name {
		if !(r == '%' || r == '|' || r == '_' || r == '-' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return fmt.Errorf("%q contains illegal characters, allowing only ^[%%|a-zA-Z0-9_-]+$", name)
		}
	}
	return nil
}
