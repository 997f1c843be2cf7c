// mlxq's page: charts of the fleet's last 15 minutes, the fleet now, the caller's batches, and a
// chat playground. Everything comes from the API with the key typed in the header.
import { KEY_STORE } from "./http.js";
import { $ } from "./dom.js";
import { initCharts, pollHistory, resetHistory } from "./charts.js";
import { initJobView, pollFleet } from "./fleet.js";
import { pollBatches } from "./batches.js";
import { initPlayground, loadModels } from "./playground.js";

function initKey() {
  $("api-key").value = localStorage.getItem(KEY_STORE) || "";
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    localStorage.setItem(KEY_STORE, $("api-key").value.trim());
    resetHistory();
    loadModels();
  });
  $("forget-key").addEventListener("click", () => {
    localStorage.removeItem(KEY_STORE);
    $("api-key").value = "";
  });
}

initKey();
initPlayground();
initJobView();
initCharts();
loadModels();
pollFleet();
pollHistory();
pollBatches();
