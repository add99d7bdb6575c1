"""The memory browser (/ui) in headless chromium: store two conversations through the API, then
do what a user does in the page and check what it shows. Run by scripts/test-ui.sh:

    browser_test.py BASE_URL API_KEY
"""

import json
import sys
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

BASE, KEY = sys.argv[1], sys.argv[2]
checks = 0


def check(cond, what):
    global checks
    if not cond:
        raise AssertionError(what)
    checks += 1
    print(f"  ok  {what}")


def texts(driver, css):
    """The texts of the elements matching css; None while the page is replacing them."""
    try:
        return [e.text for e in driver.find_elements(By.CSS_SELECTOR, css)]
    except StaleElementReferenceException:
        return None


def retry_stale(action, tries=20):
    """Runs action, again while the page is still replacing the elements it touches."""
    for _ in range(tries - 1):
        try:
            return action()
        except StaleElementReferenceException:
            time.sleep(0.1)
    return action()


def api(method, path, body=None, key=KEY):
    req = urllib.request.Request(BASE + path, method=method)
    req.add_header("authorization", f"Bearer {key}")
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, data, timeout=60) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def turns(n, topic):
    return {
        "turns": [
            {
                "turn_id": f"t{i:02}",
                "user": f"Turn {i}: I went {topic} near the lighthouse in Porto with Ines.",
                "assistant": f"How was {topic} in Porto?",
                "user_speaker": "Maya",
                "assistant_speaker": "Bot",
                "timestamp": f"2023-05-{1 + i % 28:02}T10:00:00Z",
            }
            for i in range(n)
        ],
        "wait": True,
    }


status, _ = api("POST", "/v1/conversations/trip/turns", turns(25, "kayaking"))
assert status == 202, status
status, _ = api("POST", "/v1/conversations/work/turns", turns(3, "to a meeting"))
assert status == 202, status

options = webdriver.ChromeOptions()
for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
    options.add_argument(arg)
options.binary_location = "/usr/bin/chromium"
service = webdriver.ChromeService(executable_path="/usr/bin/chromedriver")
driver = webdriver.Chrome(options=options, service=service)
wait = WebDriverWait(driver, 20)
try:
    driver.get(BASE + "/ui")
    check(driver.title == "Recollect: memory browser", "the page loads")

    # A wrong key: the API's own error is shown, nothing listed.
    driver.find_element(By.ID, "key").send_keys("not-a-key")
    driver.find_element(By.ID, "connect").click()
    err = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#conversations .error")))
    check("unauthenticated" in err.text, f"a wrong key shows the API's error ({err.text!r})")

    key = driver.find_element(By.ID, "key")
    key.clear()
    key.send_keys(KEY)
    driver.find_element(By.ID, "connect").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "li.conv")) == 2)
    names = [li.text for li in driver.find_elements(By.CSS_SELECTOR, "li.conv")]
    check(names == ["trip", "work"], f"both conversations are listed in order ({names})")

    # Page through the 25 turns of "trip": 20, then 5.
    driver.find_element(By.CSS_SELECTOR, "li.conv[data-id='trip']").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#turns .turn")) == 20)
    first = driver.find_elements(By.CSS_SELECTOR, "#turns .turn")[0].text
    check("#0" in first and "Turn 0" in first, "the first page starts at position 0")
    driver.find_element(By.ID, "turns-next").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#turns .turn")) == 5)
    page2 = texts(driver, "#turns .turn")
    check("Turn 20" in page2[0] and "Turn 24" in page2[-1], "the second page holds turns 20 to 24")
    check(not driver.find_element(By.ID, "turns-next").is_enabled(), "no page after the last")
    driver.find_element(By.ID, "turns-prev").click()
    wait.until(lambda d: (t := texts(d, "#turns .turn")) and "Turn 0" in t[0])
    check(True, "previous goes back to the first page")

    # A turn's extraction.
    retry_stale(lambda: driver.find_elements(By.CSS_SELECTOR, "#turns .turn")[3].click())
    details = wait.until(ec.presence_of_element_located((By.ID, "extraction")))
    tags = [t.lower() for t in texts(driver, "#extraction dd.tags span")]
    check("porto" in tags, f"the turn's details show its extracted location ({tags})")
    check("ines" in tags, "and its entities")
    check("lighthouse" in tags and "kayaking" in tags, "and its keywords")
    versions = driver.find_element(By.ID, "versions").text
    check(versions.startswith("1, recorded 20"), f"and its versions ({versions!r})")

    # A recall, scoped to the selected conversation: hits with sources and score parts.
    driver.find_element(By.ID, "query").send_keys("Where did Maya go kayaking?")
    driver.find_element(By.ID, "recall").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#hits .hit")) > 0)
    hit_texts = retry_stale(lambda: texts(driver, "#hits .hit") or [])
    check(len(hit_texts) == 10, f"k = 10 hits are shown ({len(hit_texts)})")
    check(all("trip" in h for h in hit_texts), "every hit is from the selected conversation")
    sources = retry_stale(lambda: driver.find_element(By.CSS_SELECTOR, "#hits .hit .sources").text)
    check(len(sources) > 0, f"a hit shows its sources ({sources!r})")
    parts = retry_stale(lambda: len(driver.find_elements(By.CSS_SELECTOR, "#hits .hit:first-child table.parts tr")))
    check(parts > 0, f"a hit shows its score parts ({parts} rows)")

    # Clicking a hit shows that memory's extraction (read through GET /v1/memories/{id}).
    shown = driver.find_element(By.ID, "extraction")
    retry_stale(lambda: driver.find_element(By.CSS_SELECTOR, "#hits .hit").click())
    wait.until(ec.staleness_of(shown))
    details = retry_stale(lambda: wait.until(ec.presence_of_element_located((By.ID, "extraction"))).text)
    check("porto" in details.lower(), "a hit's details come from its memory")
finally:
    driver.quit()

print(f"browser test: {checks} checks passed")
